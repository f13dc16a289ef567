"""Independent host oracle: the same product in float64 with numpy."""

import numpy as np


def oracle(inputs: dict[str, np.ndarray], dims: dict[str, int]) -> dict[str, np.ndarray]:
    a = inputs["a"].astype(np.float64)
    b = inputs["b"].astype(np.float64)
    return {"c": a @ b}
