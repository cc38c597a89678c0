/* SPDX-License-Identifier: MIT */
/* relay.h — gnmrd --relay-to: a node relay (relay.c). */
#ifndef GNMRD_RELAY_H
#define GNMRD_RELAY_H

/* Runs gnmrd as a node relay with its command line; returns the exit
 * status. */
int relay_main(int argc, char **argv);

#endif /* GNMRD_RELAY_H */
