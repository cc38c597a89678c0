/* SPDX-License-Identifier: MIT */
/* hello.c — joining a job: a Hello is checked, creates the job when it is
 * the first accepted one, registers the rank's units (or an observer's),
 * binds the connection and is answered with a Welcome. A rank is one
 * agent: a second live one is refused. Loop thread only. */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gnmr/error.h"
#include "history.h"
#include "jobs_priv.h"
#include "keys.h"
#include "log.h"
#include "text.h"
#include "validate.h"

/* Whether [limits] max_*_per_key apply to jobs of owner: with tenancy on,
 * to agent keys (operators are trusted with gnmrd's whole capacity). */
static int key_quota(const gnmrd *d, const char *owner) {
  return d->cfg != NULL && d->allow != NULL && owner != NULL &&
         !gnmr__allow_operator(d->allow, owner);
}

/* The live jobs that owner owns, and their units. */
static void owner_usage(const gnmrd *d, const char *owner, uint64_t *jobs,
                        uint64_t *units) {
  size_t pos = 0;
  *jobs = *units = 0;
  for (const core_job *o; (o = core_next_job(&d->jobs, &pos)) != NULL;)
    if (o->owner != NULL && strcmp(o->owner, owner) == 0) {
      (*jobs)++;
      *units += o->n_units;
    }
}

/* An owner's name for messages: its allow list NAME, else its key. */
static const char *owner_name(const gnmrd *d, const char *owner) {
  const gnmr_grant *g = gnmr__allow_find(d->allow, owner);
  return g != NULL && g->name != NULL ? g->name : owner;
}

/* core_register_units() under the unit caps: the job's ([limits]
 * max_units), its owner's over the owner's live jobs (max_units_per_key,
 * tenancy) and gnmrd's over all jobs (max_total_units: the memory that
 * Hellos can make gnmrd hold grows with the units that exist). A refusal
 * by the owner's or the global cap says so. */
static int register_capped(gnmrd *d, core_job *c, core_rank *rr,
                           const char *const *names, size_t n,
                           const uint32_t *ids, int shards,
                           core_prepared **prep, char *why, size_t whylen) {
  uint64_t total = 0, cap = d->cfg ? d->cfg->max_total_units : UINT64_MAX;
  size_t pos = 0;
  for (core_job *o; (o = core_next_job(&d->jobs, &pos)) != NULL;)
    total += o->n_units;
  uint32_t job_cap = c->max_units;
  uint64_t room = total < cap ? cap - total : 0;
  /* a tenant's share: the units of every live job its key owns */
  uint64_t kcap = key_quota(d, c->owner) ? d->cfg->max_units_per_key : 0,
           kjobs, kunits = 0, kroom = UINT64_MAX;
  if (kcap != 0) {
    owner_usage(d, c->owner, &kjobs, &kunits);
    kroom = kunits < kcap ? kcap - kunits : 0;
  }
  int by_key = kroom < room && (uint64_t)c->n_units + kroom < job_cap;
  if (by_key)
    room = kroom;
  int global = (uint64_t)c->n_units + room < job_cap;
  if (global)
    c->max_units = (uint32_t)(c->n_units + room);
  int rv = 1;
  if (prep != NULL && *prep != NULL && ids == NULL && (*prep)->n == n)
    rv = core_register_prepared(c, rr, prep, shards, why, whylen);
  if (rv == 1)
    rv = core_register_units(c, rr, names, n, ids, shards, why, whylen);
  c->max_units = job_cap;
  if (rv == GNMR_E_RANGE && by_key) {
    d->c.refused_key_units++;
    snprintf(why, whylen,
             "the jobs of %.40s hold at most %llu units ([limits] "
             "max_units_per_key); %llu are free",
             owner_name(d, c->owner), (unsigned long long)kcap,
             (unsigned long long)room);
  } else if (rv == GNMR_E_RANGE && global) {
    d->c.refused_max_total_units++;
    snprintf(why, whylen,
             "gnmrd holds at most %llu units over all its jobs ([limits] "
             "max_total_units) and %llu are free",
             (unsigned long long)cap, (unsigned long long)room);
  } else if (rv == GNMR_E_RANGE) {
    d->c.refused_max_units++;
  }
  return rv;
}

/* A rank's (or observer's) Welcome, encoded into a new buffer; 0 or
 * GNMR_E_NOMEM. The one builder: a joining agent gets it, and so does a
 * rank's old connection when it is probed (probe_live). */
static int welcome_encode(const gnmrd *d, const core_job *c,
                          const core_rank *rr, uint32_t rank, uint8_t **buf,
                          size_t *len) {
  Gnmr__Envelope env = GNMR__ENVELOPE__INIT;
  Gnmr__Welcome w = GNMR__WELCOME__INIT;
  Gnmr__Params wp;
  gnmr__params_to_wire(&c->params, &wp);
  w.job = c->name;
  w.rank = rank;
  w.n_unit_ids = rr->n_units;
  w.unit_ids = rr->ids;
  w.params = &wp;
  w.last_step = c->last_decided;
  w.term = d->term;
  w.run = c->run;
  w.pass = c->pass;
  env.body_case = GNMR__ENVELOPE__BODY_WELCOME;
  env.welcome = &w;
  return gnmr__wire_encode(&env, buf, len);
}

static void welcome(gnmrd *d, const void *id, size_t id_len, core_job *c,
                    const core_rank *rr, uint32_t rank) {
  uint8_t *buf;
  size_t len;
  if (welcome_encode(d, c, rr, rank, &buf, &len) == GNMR_OK)
    jobs__reply(d, id, id_len, buf, len);
}

/* A job's first Hello was accepted: the job exists from now on. */
static void job_accepted(job *j) {
  gnmrd *d = j->d;
  assert(j->core->run > d->last_run);
  d->last_run = j->core->run;
  d->c.jobs_created++;
  if (lifecycle_name_claim(d, j->core->name, j->core->owner) != GNMR_OK)
    LOG(ERROR, "JOB-CREATE", "job %s: out of memory; its name is reserved "
        "for its owner from gnmrd's next start (the store has it)",
        j->core->name);
  LOG(INFO, "JOB-CREATE", "job %s run %llu: %u reporters, barrier %u ms",
      j->core->name, (unsigned long long)j->core->run, j->core->reporters,
      j->core->barrier_ms);
  history_job(d->st, j->core);
  history_event(d->st, j->core, STORE_EV_JOB_STARTED, UINT32_MAX, NULL);
}

/* The Hello's requested ids as uint32_t (NULL: none), narrowed in place,
 * once: they travel as uint64 so that validate_hello refuses an id above
 * the limit instead of a silent cut; below it they fit. */
static const uint32_t *narrow_ids(Gnmr__Hello *h) {
  if (h->n_unit_ids == 0)
    return NULL;
  unsigned char *b = (unsigned char *)h->unit_ids;
  for (size_t i = 0; i < h->n_unit_ids; i++) { /* writes trail reads */
    uint64_t v;
    memcpy(&v, b + 8 * i, sizeof v);
    assert(v < UINT32_MAX);
    uint32_t v32 = (uint32_t)v;
    memcpy(b + 4 * i, &v32, sizeof v32);
  }
  return (const uint32_t *)(void *)h->unit_ids;
}

/* An observer joins (a Hello with observer set): its units map decisions to
 * its own units but add no shard; it gets every Decision and never
 * reports. A free slot is reused. */
static int observer_join(gnmrd *d, const void *id, size_t id_len, job *j,
                         const Gnmr__Hello *h, const uint32_t *ids, peer *pr,
                         const char *user) {
  core_job *c = j->core;
  char why[256];
  uint32_t slot;
  int full, rv;
  if (pr != NULL) { /* the same connection again: welcome it again */
    welcome(d, id, id_len, c, &c->observers[pr->rank], 0);
    return 1;
  }
  /* the job's units are the ranks': an observer maps decisions to them
   * and adds none (it held on to what it added, a job's worth of units
   * for good, the job unable to grow). Before every rank has registered
   * they are not all known: the observer is asked to come back (BUSY,
   * ref "layout": the agent retries within a second) */
  int layout_known = 1;
  for (uint32_t r = 0; r < c->reporters && layout_known; r++)
    layout_known = c->ranks[r].ever;
  if (!layout_known) {
    d->c.hellos_refused++;
    jobs__reply_error(d, id, id_len, GNMR_E_BUSY, "layout", 0,
                      "job %.64s: not every rank has said Hello yet; an "
                      "observer joins once they have (it retries)", c->name);
    return 0;
  }
  for (size_t i = 0; i < h->n_units; i++)
    if (!hmap_get(&c->unit_ids, h->units[i], strlen(h->units[i]), NULL)) {
      char nb[300];
      d->c.hellos_refused++;
      jobs__reply_error(d, id, id_len, GNMR_E_NOUNIT, "units", 0,
                        "unit '%.64s' is not one of job %.64s's units: an "
                        "observer maps decisions to the units its ranks "
                        "registered and adds none",
                        gnmr__escape(h->units[i], nb, sizeof nb), c->name);
      return 0;
    }
  core_rank *rr = core_observer_slot(c, &slot, &full);
  if (rr == NULL) {
    d->c.hellos_refused++;
    if (full)
      jobs__reply_error(d, id, id_len, GNMR_E_BUSY, "observer", 0,
                  "job %.64s has %u observers already", c->name,
                  CORE_MAX_OBSERVERS);
    else
      jobs__reply_error(d, id, id_len, GNMR_E_NOMEM, "observer", 0,
                  "out of memory");
    return 0;
  }
  if ((rv = register_capped(d, c, rr, (const char *const *)h->units,
                             h->n_units, ids, 0, NULL, why, sizeof why)) !=
      GNMR_OK) {
    d->c.hellos_refused++;
    jobs__reply_error(d, id, id_len, rv, "units", 0, "%s", why);
    return 0;
  }
  if (jobs__bind_connection(d, j, rr, slot, 1, id, id_len) != GNMR_OK) {
    d->c.hellos_refused++;
    jobs__reply_error(d, id, id_len, GNMR_E_NOMEM, "observer", 0, "out of memory");
    return 0;
  }
  rr->joined = 1;
  rr->user = user ? strdup(user) : NULL;
  LOG(INFO, "OBSERVER-JOIN", "job %s: an observer joined with %zu units",
      c->name, h->n_units);
  /* an observer never reports: what it holds is never history */
  if (h->n_held > 0)
    jobs__held_refused(d, c->name, h->n_held, "an observer",
                       "only a reporting rank hands decisions back");
  welcome(d, id, id_len, c, rr, 0);
  return 1;
}

/* Whether a rank's connection still reaches a live peer: its Welcome is
 * sent again. A connection ZeroMQ no longer has is forgotten. */
static int probe_live(gnmrd *d, job *j, core_rank *rr, uint32_t rank) {
  uint8_t *buf;
  size_t len;
  if (welcome_encode(d, j->core, rr, rank, &buf, &len) != GNMR_OK)
    return 0;
  int rv = server_send(d->agents, rr->conn, rr->conn_len, buf, len);
  free(buf);
  if (rv == GNMR_E_CLOSED) {
    jobs__connection_gone(j, rr, 0);
    return 0;
  }
  return rv == GNMR_OK;
}

/* Whether a fresh start under j's name ends j: j decided steps, and no
 * rank or observer of it is connected, each joined one probed (a peer
 * gone without a word is let go here; a live one is a live process of j,
 * and the Hello is then answered as ever). */
static int ends_for_fresh_start(gnmrd *d, job *j) {
  core_job *c = j->core;
  if (c->last_decided == 0)
    return 0;
  for (uint32_t r = 0; r < c->reporters; r++)
    if (c->ranks[r].joined && c->ranks[r].conn != NULL &&
        probe_live(d, j, &c->ranks[r], r))
      return 0;
  for (uint32_t o = 0; o < c->n_observers; o++)
    if (c->observers[o].joined && c->observers[o].conn != NULL &&
        probe_live(d, j, &c->observers[o], o))
      return 0;
  return 1;
}

/* Refuses a Hello: counted, answered; a job this Hello created goes (a
 * job exists only once a Hello was accepted). */
/* A second live agent for a joined rank: logged (the refused agent is
 * told too), at most once per SECOND_AGENT_LOG_MS, since a refused
 * agent asks again. */
#define SECOND_AGENT_LOG_MS 10000
static void log_second_agent(gnmrd *d, const char *job_name, uint32_t rank,
                             const char *holder, const char *refused) {
  static uint64_t last_ms, quiet;
  uint64_t now = uv_now(d->loop);
  if (last_ms != 0 && now - last_ms < SECOND_AGENT_LOG_MS) {
    quiet++;
    return;
  }
  char jb[300], hb[800], rb[800], more[64] = "";
  if (quiet > 0)
    snprintf(more, sizeof more, " (and %llu more not logged since)",
             (unsigned long long)quiet);
  LOG(WARN, "SECOND-AGENT", "rank %u of job %s is held by a live agent "
      "(%s); another (%s) asked for it and was refused: the same job name "
      "run twice, or two processes with one rank (RANK unset?)%s", rank,
      gnmr__escape(job_name, jb, sizeof jb), gnmr__escape(holder, hb, sizeof hb),
      gnmr__escape(refused, rb, sizeof rb), more);
  last_ms = now;
  quiet = 0;
}

/* One Hello on its way to a Welcome or a refusal: what its phases
 * share. */
typedef struct hello_ctx {
  gnmrd *d;
  const void *id;
  size_t id_len;
  Gnmr__Hello *h;
  const char *user;
  policy_params prm;
  uint32_t barrier;
  core_prepared **prep;
  const uint32_t *ids;    /* the units' job-wide ids */
  peer *pr;               /* this connection's (job, rank), if joined */
  job *j;                 /* the job joined, once found or made */
  int created;            /* j made by this Hello: freed if refused */
  const char *name_owner; /* the owner of the name's earlier runs */
} hello_ctx;

/* Counts and answers a refusal, frees a job this Hello made, and leaves
 * the phase (-1: the Hello is done with). */
#define REFUSE(code, ref, ...)                                                 \
  do {                                                                         \
    hc->d->c.hellos_refused++;                                                 \
    jobs__reply_error(hc->d, hc->id, hc->id_len, code, ref, 0, __VA_ARGS__);   \
    if (hc->created)                                                           \
      jobs__free(&hc->j);                                                      \
    return -1;                                                                 \
  } while (0)

void hello__on_hello(gnmrd *d, const void *id, size_t id_len, Gnmr__Hello *h,
                     const char *user) {
  policy_params prm;
  uint32_t barrier = 0;
  const char *ref = "";
  char why[256];
  d->c.hellos++;
  int vrv = gnmr__validate_hello(h, d->cfg ? &d->cfg->policy : NULL,
                                 d->cfg ? (uint32_t)d->cfg->barrier_ms : 0,
                                 &prm, &barrier, &ref, why, sizeof why);
  if (vrv != GNMR_OK) {
    d->c.hellos_refused++;
    jobs__reply_error(d, id, id_len, vrv, ref, 0, "%s", why);
    return;
  }
  hello__on_hello_checked(d, id, id_len, h, user, &prm, barrier, NULL);
}

/* Phase 1: the job the Hello names, if it is live: a connection that
 * joined as something else is refused; a fresh start under the name of a
 * run whose processes are gone ends that run; a resume of an ended run is
 * read back first. 0 to go on. */
static int find_job(hello_ctx *hc) {
  gnmrd *d = hc->d;
  Gnmr__Hello *h = hc->h;
  uint64_t v;
  if (hmap_get(&d->peers, hc->id, hc->id_len, &v)) {
    peer *pr = hc->pr = (peer *)(uintptr_t)v;
    if (strcmp(pr->j->core->name, h->job) != 0 ||
        pr->observer != h->observer || (!pr->observer && pr->rank != h->rank))
      REFUSE(GNMR_E_MISMATCH, "rank",
             "this connection already joined job %.64s as %s %u",
             pr->j->core->name, pr->observer ? "observer" : "rank",
             pr->rank);
  }
  job *j = job_of(core_find(&d->jobs, h->job));
  if (j != NULL && hc->pr == NULL && h->start == GNMR_START_FRESH &&
      !h->observer && ends_for_fresh_start(d, j) &&
      (d->allow == NULL ||
       gnmr__allow_may(d->allow, hc->user, j->core->owner, h->job))) {
    /* a training run from its first step under the name of a run that
     * did not finish and whose processes are gone: that run is over (its
     * state kept in the history), and this one begins a new run, never
     * the old run's statistics (docs/python.md, "Runs and resumes") */
    lifecycle__finish(j, FINISH_FRESH);
    j = NULL;
  }
  hc->name_owner = j == NULL ? lifecycle_name_owner(d, h->job) : NULL;
  if (j == NULL && hc->pr == NULL && h->start == GNMR_START_RESUME &&
      !h->observer &&
      (d->allow == NULL ||
       gnmr__allow_may(d->allow, hc->user, hc->name_owner, h->job)) &&
      reopen__ask(d, h->job, hc->id, hc->id_len,
                  d->allow != NULL ? hc->user : NULL) == REOPEN_PENDING)
    /* a resume under a name whose run ended: read back first (reopen.c);
     * ref "run": the agent says Hello again soon */
    REFUSE(GNMR_E_BUSY, "run", "job %.64s has no live run: its newest run "
           "is read back from the history to be resumed; the Hello is sent "
           "again", h->job);
  if (j != NULL)
    jobs__quiesce(j); /* registration changes the engine and the units */
  if (j != NULL && d->allow != NULL &&
      !gnmr__allow_may(d->allow, hc->user, j->core->owner, h->job))
    REFUSE(GNMR_E_DENIED, "job", "job %.64s belongs to another key, and "
           "the allow list grants this one no jobs= pattern that matches",
           h->job);
  hc->j = j;
  return 0;
}

/* Hello.node_ranks: 0 and 1 both say each rank is its own node */
#define NODE_RANKS(x) ((x) > 1 ? (x) : 1u)

/* Phase 2a: a live job's settings must be the Hello's. */
static int match_job(hello_ctx *hc) {
  core_job *c = hc->j->core;
  Gnmr__Hello *h = hc->h;
  if (c->reporters != h->reporters)
    REFUSE(GNMR_E_MISMATCH, "reporters",
           "job %.64s has %u reporters, this agent says %u", c->name,
           c->reporters, h->reporters);
  if (!policy_params_equal(&c->hello_params, &hc->prm))
    REFUSE(GNMR_E_MISMATCH, "params",
           "job %.64s runs with other policy parameters", c->name);
  if (c->barrier_ms != hc->barrier)
    REFUSE(GNMR_E_MISMATCH, "barrier_ms",
           "job %.64s has a %u ms barrier, this agent says %u", c->name,
           c->barrier_ms, hc->barrier);
  if (c->node_ranks_set && NODE_RANKS(c->node_ranks) != NODE_RANKS(h->node_ranks))
    REFUSE(GNMR_E_MISMATCH, "node_ranks",
           "job %.64s sums %u ranks a node, this agent says %u", c->name,
           NODE_RANKS(c->node_ranks), NODE_RANKS(h->node_ranks));
  return 0;
}

/* Phase 2b: a new job, if the allow list, the name's owner and the
 * limits let this key start it. */
static int create_job(hello_ctx *hc) {
  gnmrd *d = hc->d;
  Gnmr__Hello *h = hc->h;
  const char *user = hc->user, *name_owner = hc->name_owner;
  const char *owner = name_owner != NULL ? name_owner : user;
  uint64_t kjobs = 0, kunits = 0; /* a tenant's live jobs and units */
  if (d->allow != NULL && name_owner != NULL &&
      !gnmr__allow_may(d->allow, user, name_owner, h->job))
    REFUSE(GNMR_E_DENIED, "job", "job %.64s belongs to another key (its "
           "earlier runs), and the allow list grants this one no jobs= "
           "pattern that matches", h->job);
  const gnmr_grant *g = d->allow != NULL && name_owner == NULL
                            ? gnmr__allow_reserved(d->allow, user, h->job)
                            : NULL;
  if (g != NULL)
    REFUSE(GNMR_E_DENIED, "job", "job name %.64s is reserved for another "
           "key (%.40s, owns=%.64s in the allow list)", h->job,
           g->name ? g->name : "no name", g->owns);
  if (d->cfg != NULL && core_count(&d->jobs) >= d->cfg->max_jobs) {
    d->c.refused_max_jobs++;
    REFUSE(GNMR_E_BUSY, "job", "gnmrd serves %zu jobs already ([limits] "
           "max_jobs)", core_count(&d->jobs));
  }
  if (key_quota(d, owner) && d->cfg->max_jobs_per_key != 0 &&
      (owner_usage(d, owner, &kjobs, &kunits),
       kjobs >= d->cfg->max_jobs_per_key)) {
    d->c.refused_key_jobs++;
    REFUSE(GNMR_E_BUSY, "job",
           "%.64s owns %llu live jobs already ([limits] "
           "max_jobs_per_key)",
           owner_name(d, owner), (unsigned long long)kjobs);
  }
  if ((hc->j = jobs__create(d, h->job, &hc->prm, h->reporters, hc->barrier)) ==
      NULL)
    REFUSE(GNMR_E_NOMEM, "job", "out of memory");
  hc->created = 1;
  job *j = hc->j;
  j->core->node_ranks = NODE_RANKS(h->node_ranks);
  j->core->node_ranks_set = 1;
  j->core->run = d->last_run + 1; /* taken when the Hello is accepted */
  /* decisions of a run the history never recorded (gnmrd killed before
   * its first commit, or with its disk full): the run goes on under its
   * id, and those decisions are adopted as a restored job's. Only a
   * rank's, and only sealed ones: the run id is then one a gnmrd of this
   * store gave out (after every run it stored), never a peer's choice. */
  size_t unsealed = 0;
  for (size_t i = 0; i < h->n_held && !h->observer; i++) {
    const Gnmr__Decision *hd = h->held[i];
    if (hd->run < j->core->run)
      continue; /* a run this store recorded: not this new job's */
    if (!jobs__held_sealed(d, h->job, hd)) {
      unsealed++;
      continue;
    }
    j->core->run = hd->run;
    j->first_pass = 1;
  }
  if (unsealed > 0)
    jobs__held_refused(d, h->job, unsealed, "the job's first Hello",
                       "not sealed by a gnmrd of this store (a forged or "
                       "altered decision, or one from another database)");
  /* a new run of a name keeps the name's owner, whoever starts it (an
   * operator, a key whose grant matches) */
  if (owner != NULL && (j->core->owner = strdup(owner)) == NULL)
    REFUSE(GNMR_E_NOMEM, "job", "out of memory");
  return 0;
}

/* Phase 3: the rank's checks (its key, its units, a live agent already
 * holding it), its units registered on its first join, and this
 * connection bound to it. *registered: the units are new. */
static int bind_rank(hello_ctx *hc, int *registered) {
  gnmrd *d = hc->d;
  Gnmr__Hello *h = hc->h;
  job *j = hc->j;
  core_job *c = j->core;
  core_rank *rr = &c->ranks[h->rank];
  const char *const *names = (const char *const *)h->units;
  uint64_t v;
  /* under CURVE a rank belongs to the key it first joined with */
  if (hc->user != NULL && rr->user != NULL && strcmp(hc->user, rr->user) != 0)
    REFUSE(GNMR_E_MISMATCH, "rank",
           "rank %u of job %.64s joined with another key", h->rank, c->name);
  if (rr->ever && !core_same_units(c, rr, names, h->n_units, hc->ids))
    REFUSE(GNMR_E_MISMATCH, "units",
           "rank %u of job %.64s joined before with other units", h->rank,
           c->name);
  *registered = 0;
  if (!rr->ever) {
    char why[256];
    int urv = register_capped(d, c, rr, names, h->n_units, hc->ids, 1, hc->prep,
                              why, sizeof why);
    if (urv != GNMR_OK)
      REFUSE(urv, "unit_ids", "%s", why);
    *registered = 1;
  }
  /* A rank is one agent: another live agent asking for a joined rank is
   * refused, naming both (the same job name run twice, or two processes
   * without RANK). The old connection is probed with its own Welcome: a
   * gone peer fails at once (ROUTER_MANDATORY), a live one gets a harmless
   * repeat. The same agent reconnecting replaces its connection. */
  /* A Hello that says no instance is never the same agent as one that
   * did: leaving it out must not take over a joined rank. */
  if (hc->pr == NULL && rr->joined && rr->conn != NULL &&
      rr->instance != NULL &&
      (h->instance[0] == '\0' || strcmp(rr->instance, h->instance) != 0) &&
      probe_live(d, j, rr, h->rank)) {
    const char *other = h->instance[0] != '\0' ? h->instance
                                                : "no instance given";
    log_second_agent(d, c->name, h->rank, rr->instance, other);
    REFUSE(GNMR_E_MISMATCH, "rank",
           "rank %u of job %.64s is held by a live agent (%.80s); this "
           "agent (%.80s) is refused: the same job name run twice, or two "
           "processes with one rank (RANK unset?)", h->rank, c->name,
           rr->instance, other);
  }
  /* Bind this connection to (job, rank), replacing an older connection. */
  if (hc->pr == NULL) {
    if (rr->conn != NULL && hmap_get(&d->peers, rr->conn, rr->conn_len, &v)) {
      free((peer *)(uintptr_t)v);
      hmap_del(&d->peers, rr->conn, rr->conn_len);
    }
    if (jobs__bind_connection(d, j, rr, h->rank, 0, hc->id, hc->id_len) !=
        GNMR_OK)
      REFUSE(GNMR_E_NOMEM, "rank", "out of memory");
  }
  return 0;
}

/* Phase 4: the rank joined: what the history keeps of it, the decisions
 * its agent held, and its Welcome. returning: it had said Bye. */
static void rank_joined(hello_ctx *hc, int registered, int returning) {
  gnmrd *d = hc->d;
  Gnmr__Hello *h = hc->h;
  core_job *c = hc->j->core;
  core_rank *rr = &c->ranks[h->rank];
  char rank_text[32];
  snprintf(rank_text, sizeof rank_text, "rank %u", h->rank);
  if (hc->created)
    job_accepted(hc->j);
  if (!c->node_ranks_set) { /* a restored job: its first rank says */
    c->node_ranks = NODE_RANKS(h->node_ranks);
    c->node_ranks_set = 1;
  }
  if (registered)
    history_rank(d->st, c, h->rank);
  if (hc->user != NULL && rr->user == NULL)
    rr->user = strdup(hc->user);
  if (h->instance[0] != '\0') {
    free(rr->instance);
    rr->instance = strdup(h->instance);
  }
  if (!rr->joined)
    history_event(d->st, c, STORE_EV_AGENT_JOINED, h->rank, rank_text);
  jobs__adopt_held(hc->j, h->held, h->n_held, rank_text);
  core_join(c, h->rank, returning);
  LOG(INFO, "AGENT-JOIN", "job %s rank %u/%u joined with %zu units", c->name,
      h->rank, c->reporters, h->n_units);
  welcome(d, hc->id, hc->id_len, c, rr, h->rank);
}

void hello__on_hello_checked(gnmrd *d, const void *id, size_t id_len,
                             Gnmr__Hello *h, const char *user,
                             const policy_params *checked, uint32_t barrier,
                             core_prepared **prep) {
  hello_ctx hc = {.d = d,
                  .id = id,
                  .id_len = id_len,
                  .h = h,
                  .user = user,
                  .prm = *checked,
                  .barrier = barrier,
                  .prep = prep,
                  .ids = narrow_ids(h)};
  int registered = 0;
  if (find_job(&hc) != 0)
    return;
  if ((hc.j != NULL ? match_job(&hc) : create_job(&hc)) != 0)
    return;
  if (h->observer) {
    if (!observer_join(d, id, id_len, hc.j, h, hc.ids, hc.pr, user)) {
      if (hc.created)
        jobs__free(&hc.j);
      return;
    }
    if (hc.created)
      job_accepted(hc.j);
    return;
  }
  const core_rank *rr = &hc.j->core->ranks[h->rank];
  int returning = rr->ever && !rr->joined; /* said Bye before */
  if (bind_rank(&hc, &registered) != 0)
    return;
  rank_joined(&hc, registered, returning);
}
#undef REFUSE

