"""Independent host oracle: the product of the bfloat16 inputs in float64 with numpy.

bfloat16 values are exact in float64, so this is the exact product up to float64 rounding.
"""

import numpy as np


def oracle(inputs: dict[str, np.ndarray], dims: dict[str, int]) -> dict[str, np.ndarray]:
    a = inputs["a"].astype(np.float64)
    b = inputs["b"].astype(np.float64)
    return {"c": a @ b}
