/* SPDX-License-Identifier: MIT */
/* cuda_plan.c — building, comparing and serialising the CUDA backend's
 * segment and chunk tables (see cuda_plan.h). Plain C: it runs, and is
 * tested, on machines without a GPU. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_plan.h"

void gnmr__plan_clear(gnmr__plan *p) {
  free(p->segs);
  free(p->chunks);
  free(p->unit_begin);
  free(p->seen);
  memset(p, 0, sizeof *p);
}

static const uint32_t elem_size[] = {4, 2, 2, 8, 1, 1};

int gnmr__plan_build(gnmr__plan *p, const gnmr_tensor *t, size_t n,
                     uint32_t n_units) {
  memset(p, 0, sizeof *p);
  if ((t == NULL && n > 0) || n_units == 0 || n > UINT32_MAX)
    return GNMR_E_INVAL;
  uint64_t chunks = 0;
  uint32_t segs = 0;
  for (size_t i = 0; i < n; i++) {
    if (t[i].unit >= n_units || t[i].dtype > GNMR_DTYPE_F8E5M2 ||
        (t[i].data == NULL && t[i].numel > 0) || !(t[i].scale >= 0) ||
        !isfinite(t[i].scale))
      return GNMR_E_INVAL;
    if (t[i].numel == 0)
      continue;
    /* the GPU loads whole elements: data must be aligned to its type */
    if ((uintptr_t)t[i].data % elem_size[t[i].dtype] != 0)
      return GNMR_E_INVAL;
    segs++;
    chunks += (t[i].numel + GNMR_CUDA_CHUNK - 1) / GNMR_CUDA_CHUNK;
    if (chunks >= UINT32_MAX)
      return GNMR_E_TOOBIG;
  }
  p->n_units = n_units;
  p->n_segs = segs;
  p->n_chunks = (uint32_t)chunks;
  p->segs = calloc(segs ? segs : 1, sizeof *p->segs);
  p->chunks = calloc(chunks ? chunks : 1, sizeof *p->chunks);
  p->unit_begin = calloc((size_t)n_units + 1, sizeof *p->unit_begin);
  p->seen = calloc(n_units, 1);
  uint32_t *next = calloc((size_t)n_units + 1, sizeof *next);
  if (!p->segs || !p->chunks || !p->unit_begin || !p->seen || !next) {
    free(next);
    gnmr__plan_clear(p);
    return GNMR_E_NOMEM;
  }
  /* counting sort by unit, stable in registration order */
  for (size_t i = 0; i < n; i++) {
    p->seen[t[i].unit] = 1;
    p->unit_begin[t[i].unit + 1] +=
        (uint32_t)((t[i].numel + GNMR_CUDA_CHUNK - 1) / GNMR_CUDA_CHUNK);
    next[t[i].unit + 1] += t[i].numel > 0;
  }
  for (uint32_t u = 0; u < n_units; u++) {
    p->unit_begin[u + 1] += p->unit_begin[u];
    next[u + 1] += next[u];
  }
  uint32_t *cpos = malloc((size_t)n_units * sizeof *cpos);
  if (cpos == NULL) {
    free(next);
    gnmr__plan_clear(p);
    return GNMR_E_NOMEM;
  }
  memcpy(cpos, p->unit_begin, (size_t)n_units * sizeof *cpos);
  for (size_t i = 0; i < n; i++) {
    if (t[i].numel == 0)
      continue;
    uint32_t s = next[t[i].unit]++;
    uint64_t addr = (uint64_t)(uintptr_t)t[i].data;
    p->segs[s] = (gnmr__seg){
        .addr = addr,
        .numel = t[i].numel,
        .dtype = (uint16_t)t[i].dtype,
        .flags = addr % 16 == 0 ? GNMR_SEG_ALIGNED : 0,
        .unit = t[i].unit,
        .scale2 = t[i].scale == 0 ? 1.0 : t[i].scale * t[i].scale,
    };
    for (uint64_t off = 0; off < t[i].numel; off += GNMR_CUDA_CHUNK) {
      uint64_t len = t[i].numel - off;
      p->chunks[cpos[t[i].unit]++] = (gnmr__chunk){
          .start = off,
          .seg = s,
          .len = (uint32_t)(len < GNMR_CUDA_CHUNK ? len : GNMR_CUDA_CHUNK),
      };
    }
  }
  free(cpos);
  free(next);
  return GNMR_OK;
}

int gnmr__plan_equal(const gnmr__plan *a, const gnmr__plan *b) {
  return a->n_units == b->n_units && a->n_segs == b->n_segs &&
         a->n_chunks == b->n_chunks &&
         memcmp(a->segs, b->segs, a->n_segs * sizeof *a->segs) == 0 &&
         memcmp(a->unit_begin, b->unit_begin,
                ((size_t)a->n_units + 1) * sizeof *a->unit_begin) == 0 &&
         memcmp(a->seen, b->seen, a->n_units) == 0;
  /* chunks follow from segs and unit_begin */
}

static size_t up16(size_t x) { return (x + 15) & ~(size_t)15; }

size_t gnmr__plan_tables_size(const gnmr__plan *p, gnmr__dev_header *h) {
  gnmr__dev_header hh = {.n_chunks = p->n_chunks, .n_units = p->n_units};
  size_t off = up16(sizeof hh);
  hh.segs_off = off;
  off = up16(off + (size_t)p->n_segs * sizeof(gnmr__seg));
  hh.chunks_off = off;
  off = up16(off + (size_t)p->n_chunks * sizeof(gnmr__chunk));
  hh.unit_begin_off = off;
  off = up16(off + ((size_t)p->n_units + 1) * sizeof(uint32_t));
  hh.seen_off = off;
  off = up16(off + p->n_units);
  if (h)
    *h = hh;
  return off;
}

void gnmr__plan_tables_write(const gnmr__plan *p, void *buf) {
  gnmr__dev_header h;
  size_t size = gnmr__plan_tables_size(p, &h);
  char *b = buf;
  memset(b, 0, size);
  memcpy(b, &h, sizeof h);
  memcpy(b + h.segs_off, p->segs, (size_t)p->n_segs * sizeof(gnmr__seg));
  memcpy(b + h.chunks_off, p->chunks,
         (size_t)p->n_chunks * sizeof(gnmr__chunk));
  memcpy(b + h.unit_begin_off, p->unit_begin,
         ((size_t)p->n_units + 1) * sizeof(uint32_t));
  memcpy(b + h.seen_off, p->seen, p->n_units);
}

size_t gnmr__result_size(uint32_t n_units) {
  return up16((size_t)n_units * 17);
}
