"""cuBLAS's numbers as cublas_api.h and library_types.h define them, and the gemm types the referee
calls: shared by the parent (harness/vendor_yardstick.py, harness/task_checks.py) and the worker
(cublas.py). Pure constants: importing this loads nothing.
"""

# cudaDataType_t (library_types.h; the same values as cuda.bindings.runtime.cudaDataType).
CUDA_R_32F, CUDA_R_64F, CUDA_R_16F, CUDA_R_16BF = 0, 1, 2, 14
# cublasComputeType_t, cublasOperation_t and cublasGemmAlgo_t (cublas_api.h).
CUBLAS_COMPUTE_32F = 68  # float32 arithmetic: never TF32 (that is CUBLAS_COMPUTE_32F_FAST_TF32 = 77)
CUBLAS_OP_N = 0
CUBLAS_GEMM_DEFAULT = -1
# cuBLAS takes int dimensions and leading dimensions.
MAX_GEMM_DIM = 2**31 - 1

CUDA_TYPES = {"float32": CUDA_R_32F, "float16": CUDA_R_16F, "bfloat16": CUDA_R_16BF}
# (dtype of A and B, dtype of C) -> compute type; alpha and beta are then host float32 values.
GEMM_TYPES = {
    ("float32", "float32"): CUBLAS_COMPUTE_32F,
    ("bfloat16", "float32"): CUBLAS_COMPUTE_32F,
    ("bfloat16", "bfloat16"): CUBLAS_COMPUTE_32F,
    ("float16", "float32"): CUBLAS_COMPUTE_32F,
    ("float16", "float16"): CUBLAS_COMPUTE_32F,
}
