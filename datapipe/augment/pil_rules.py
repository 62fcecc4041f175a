"""PIL's constants that the CPU and DALI kernels both follow, written once."""

L_WEIGHTS = (19595, 38470, 7471)  # convert("L"): (R 19595 + G 38470 + B 7471 + 32768) >> 16
SMOOTH = ((1, 1, 1), (1, 5, 1), (1, 1, 1))  # ImageFilter.SMOOTH's kernel, divided by 13 and rounded
SMOOTH_SCALE = 13
