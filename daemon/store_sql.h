/* SPDX-License-Identifier: MIT */
/* store_sql.h — the store's private SQL pieces shared by its writer
 * (store.c) and its queries (store_query.c): the parameter columns,
 * generated from the table (gnmr/params.h). The jobs and params tables
 * have one column per parameter, of its name; a new parameter needs a
 * migration (store.c) adding its two columns. */
#ifndef GNMRD_STORE_SQL_H
#define GNMRD_STORE_SQL_H

#include "gnmr/params.h"

#define STORE__PCOL(name, ctype, kind, opt, env, def, inh) ", " #name
#define STORE__PQ(name, ctype, kind, opt, env, def, inh) ",?"
#define STORE__PSET(name, ctype, kind, opt, env, def, inh)                   \
  ", " #name "=excluded." #name
/* ", alpha, beta, ...", ",?,?,...", ", alpha=excluded.alpha, ..." */
#define PARAM_COLS GNMR_PARAMS_MAP(STORE__PCOL)
#define PARAM_QS GNMR_PARAMS_MAP(STORE__PQ)
#define PARAM_SETS GNMR_PARAMS_MAP(STORE__PSET)

#endif /* GNMRD_STORE_SQL_H */
