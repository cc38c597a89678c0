# SPDX-License-Identifier: MIT
# Generated from include/gnmr/params.h by `make python-params`; do not edit.
# (name, ctypes type, default, inherits, kind): gnmr_params in its C order.
PARAMS = [
    ("alpha", "c_double", 6.0, "", "threshold"),
    ("beta", "c_double", 8.0, "", "threshold"),
    ("window", "c_uint32", 8, "", "window"),
    ("max_active", "c_uint32", 4, "", "u32"),
    ("lock_steps", "c_uint32", 4, "", "u32"),
    ("warmup_steps", "c_uint64", 5, "", "u64"),
    ("early_alpha", "c_double", 0.0, "alpha", "threshold"),
    ("early_beta", "c_double", 0.0, "beta", "threshold"),
    ("early_steps", "c_uint64", 0, "", "u64"),
    ("mean_horizon", "c_uint64", 20, "", "u64"),
    ("job_relative", "c_uint32", 1, "", "flag"),
    ("confirm_steps", "c_uint32", 2, "", "u32"),
    ("measure_alpha", "c_double", 4.0, "", "signal"),
    ("measure_beta", "c_double", 3.0, "", "signal"),
    ("same_step", "c_uint32", 0, "", "flag"),
]
