# The C row loop of recsys_doctor/loaders/_pagecodec.c (its signature, for the type checker).
from typing import Any

import numpy as np

def decode(file: Any, page_size: int, usable: int, pages: np.ndarray, columns: np.ndarray,
           values: np.ndarray, nulls: np.ndarray, null_counts: np.ndarray, /) -> int: ...
