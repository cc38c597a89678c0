/* SPDX-License-Identifier: MIT */
/* store_view.c: a job's status, units or top from the store, the view of
 * store_query (store_query.h). gnmrd answers a finished job's views with
 * it; gnmrctl --store links it (with views.c and core*.c) to answer them
 * with no gnmrd. */
#ifndef GNMRD_STORE_VIEW_H
#define GNMRD_STORE_VIEW_H

struct store_query;
struct db;
struct json_t;
struct json_t *store_view_job(struct store_query *q, struct db *db);

#endif /* GNMRD_STORE_VIEW_H */
