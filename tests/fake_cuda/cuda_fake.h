/* SPDX-License-Identifier: MIT */
/* cuda_fake.h — controls of the stand-in CUDA runtime (cuda_fake.c). */
#ifndef GNMR_CUDA_FAKE_H
#define GNMR_CUDA_FAKE_H

#include <stdio.h>

/* The call of `name` after `after` successful ones fails once (NULL: no
 * failure). */
void fake_cuda_fail(const char *name, int after);
/* Devices cudaGetDeviceCount reports (default 1). */
void fake_cuda_devices(int n);
/* Kernel launches run so far. */
int fake_cuda_launches(void);
/* Device, pinned and handle allocations not yet freed. */
int fake_cuda_live_allocs(void);
/* Device-wide synchronizations (cudaFree, cudaFreeHost) so far. */
int fake_cuda_device_syncs(void);
/* Ordering violations so far (see cuda_fake.c), the first described. */
int fake_cuda_violations(void);
const char *fake_cuda_violation(void);
void fake_cuda_reset_violations(void);
/* Nonzero: some ready work also runs early, at random from this seed. */
void fake_cuda_seed(unsigned seed);

#endif /* GNMR_CUDA_FAKE_H */
