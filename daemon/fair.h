/* Places shared fairly between peers' address groups (issue 62).
 *
 * Without tenancy gnmrd knows a peer by its connection only, and a peer
 * can open as many connections as the cap allows: a place per
 * connection lets 32 connections of one host hold every large-Hello
 * place and every resume read. A peer's address group (server.h,
 * server_msg_group: its IP address over TCP, its user over IPC) is the
 * next best identity. All the ranks of a node share one, so a hard cap
 * per group would queue one node's own Hellos behind each other with
 * places free; instead a group holds more than its share only while
 * nobody else wants one: a group that was refused a place while it held
 * fewer than its share marks the places contested for FAIR_WAIT_MS, and
 * meanwhile a group at its share or over takes no more. A group over its
 * share that is refused marks nothing (a flood cannot keep the mark its
 * own). Several hosts, or several users, are several groups: what stops
 * one party with many addresses is tenancy (a CURVE key's share is
 * strict). Loop thread. */
#ifndef GNMRD_FAIR_H
#define GNMRD_FAIR_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* longer than an agent waits before it sends a refused Hello again
 * (cuda_agent/agent_priv.h, HELLO_REFUSED_MS: 5 s; a resume's, 250 ms),
 * so that a waiting agent's next try finds the place kept for it */
#define FAIR_WAIT_MS 6000
#define FAIR_GROUP_MAX 64

typedef struct fair_wait {
  char group[FAIR_GROUP_MAX]; /* the group that waited last */
  uint64_t until;             /* loop ms; 0: nobody waits */
} fair_wait;

/* Whether a group other than `group` waited for a place lately. */
static inline int fair_contested(const fair_wait *w, const char *group,
                                 uint64_t now) {
  return w->until > now && (group == NULL || strcmp(w->group, group) != 0);
}

/* `group`, holding `held` places of its share `share`, was refused one:
 * the places are contested unless it held its share already. */
static inline void fair_refused(fair_wait *w, const char *group,
                                unsigned held, unsigned share, uint64_t now) {
  if (group == NULL || held >= share)
    return;
  snprintf(w->group, sizeof w->group, "%s", group);
  w->until = now + FAIR_WAIT_MS;
}

#endif /* GNMRD_FAIR_H */
