/* SPDX-License-Identifier: MIT */
/* store_migrate.h — creating and migrating the history's schema (SQLite
 * and PostgreSQL), and the connection's set-up. For gnmrd's writer. */
#ifndef GNMR_STORE_MIGRATE_H
#define GNMR_STORE_MIGRATE_H

#include <stddef.h>
#include <stdint.h>

#include "db.h"

/* Runs sql; GNMR_E_STORE with the database's message in err (if not
 * NULL). */
int store__exec(db_conn *db, const char *sql, char *err, size_t errlen);
/* Sets the pragmas every connection of ours uses. */
int store__configure(db_conn *db);
/* PRAGMA quick_check: GNMR_E_STORE with SQLite's first complaint when
 * the database is damaged. */
int store__integrity(db_conn *db, char *err, size_t errlen);
/* Creates or migrates the schema to STORE_SCHEMA_VERSION; refuses a
 * newer one. */
int store__migrate(db_conn *db, char *err, size_t errlen);

/* The key gnmrd seals its decisions with (daemon/seal.h): the database's
 * meta row 'seal_key', made from getrandom() by the first gnmrd that
 * opens the database; GNMR_E_STORE (err says why) when it cannot be
 * written or read back whole. Whoever can read the database can read it. */
/* The next leadership term: the database's meta row 'term' plus one, or
 * the wall clock in ms when that is more, written and read back; every
 * gnmrd that starts serving the store calls it once, so terms only grow. */
int store__term_next(db_conn *db, uint64_t *term, char *err, size_t errlen);

#define STORE_SEAL_KEY_BYTES 32
int store__seal_key(db_conn *db, uint8_t key[STORE_SEAL_KEY_BYTES], char *err,
                    size_t errlen);

#endif /* GNMR_STORE_MIGRATE_H */
