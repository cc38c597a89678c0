/* SPDX-License-Identifier: MIT */
/* error.c — gnmr_strerror() and gnmr_errname(), generated from GNMR_ERR_MAP
 * so that the enum and its messages cannot drift apart. */
#include "gnmr/error.h"

const char *gnmr_strerror(int code) {
  switch (code) {
#define GNMR__ERR_MSG(name, value, msg) \
  case value:                           \
    return msg;
    GNMR_ERR_MAP(GNMR__ERR_MSG)
#undef GNMR__ERR_MSG
  default:
    return "unknown error";
  }
}

const char *gnmr_errname(int code) {
  switch (code) {
#define GNMR__ERR_NAME(name, value, msg) \
  case value:                            \
    return "GNMR_E_" #name;
    GNMR_ERR_MAP(GNMR__ERR_NAME)
#undef GNMR__ERR_NAME
  default:
    return "GNMR_E_UNKNOWN";
  }
}
