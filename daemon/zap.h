/* SPDX-License-Identifier: MIT */
/* zap.h — gnmrd's ZAP handler (ZeroMQ authentication protocol, RFC 27):
 * a REP socket bound to inproc://zeromq.zap.01 in gnmrd's context before
 * any CURVE server socket, answering from the loop thread. It allows a
 * CURVE client whose public key is in the allow list (the key, in Z85,
 * becomes the message's User-Id) and denies everything else. */
#ifndef GNMRD_ZAP_H
#define GNMRD_ZAP_H

#include <stdint.h>
#include <uv.h>

#include "keys.h"

typedef struct zap zap;

/* Binds the handler, which admits the keys of allowed (kept by the
 * caller until zap_close). *denied is incremented for each refused
 * request. */
int zap_open(uv_loop_t *loop, void *zctx, const gnmr_allow *allowed,
             uint64_t *denied, zap **out, char *err, size_t errlen);
void zap_close(zap **zp); /* NULL-safe, nulls *zp; run the loop afterwards */

#endif /* GNMRD_ZAP_H */
