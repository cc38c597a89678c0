/* SPDX-License-Identifier: MIT */
/* num.h — strict parsers for the numbers users type (CLI options, CSV
 * fields, config values): the whole string must be the number, no hex, no
 * "infinity" spellings, no silent overflow. Each returns 0 or GNMR_E_PARSE
 * (not a number) / GNMR_E_RANGE (a number out of range). */
#ifndef GNMR_NUM_H
#define GNMR_NUM_H

#include <stddef.h>
#include <stdint.h>

/* Unsigned decimal integer, digits only, at most max. s has n bytes (not
 * necessarily NUL-terminated). */
int gnmr__parse_u64n(const char *s, size_t n, uint64_t max, uint64_t *out);
int gnmr__parse_u64(const char *s, uint64_t max, uint64_t *out);

/* Decimal floating-point number: [+-]digits[.digits][(e|E)[+-]digits] or
 * [+-].digits..., plus "nan", "inf", "+inf", "-inf" (any case) when
 * allow_nonfinite. Finite values that overflow a double are GNMR_E_RANGE. */
int gnmr__parse_doublen(const char *s, size_t n, int allow_nonfinite,
                        double *out);
int gnmr__parse_double(const char *s, int allow_nonfinite, double *out);

#endif /* GNMR_NUM_H */
