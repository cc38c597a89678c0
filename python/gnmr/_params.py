# SPDX-License-Identifier: MIT
# Generated from include/gnmr/params.h by `make python-params`; do not edit.
# (name, ctypes type, default, inherits): gnmr_params in its C order.
PARAMS = [
    ("alpha", "c_double", 6.0, ""),
    ("beta", "c_double", 8.0, ""),
    ("window", "c_uint32", 8, ""),
    ("max_active", "c_uint32", 4, ""),
    ("lock_steps", "c_uint32", 4, ""),
    ("warmup_steps", "c_uint64", 5, ""),
    ("early_alpha", "c_double", 0.0, "alpha"),
    ("early_beta", "c_double", 0.0, "beta"),
    ("early_steps", "c_uint64", 0, ""),
    ("mean_horizon", "c_uint64", 20, ""),
    ("job_relative", "c_uint32", 1, ""),
    ("confirm_steps", "c_uint32", 2, ""),
]
