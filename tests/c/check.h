/*
 * check.h: how the C test hosts count their checks. Each host is one translation unit that
 * includes this once; CHECK records a failure with its place and message and carries on, and
 * check_report prints the tally and gives the exit status.
 */
#ifndef RVM_TEST_CHECK_H
#define RVM_TEST_CHECK_H

#include <stdio.h>

static int failures = 0, checks = 0;

#define CHECK(cond, ...)                                   \
  do {                                                     \
    checks++;                                              \
    if (!(cond)) {                                         \
      failures++;                                          \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                        \
      fprintf(stderr, "\n");                               \
    }                                                      \
  } while (0)

/* Prints "<name>: N checks, M failed" and returns 0 when every check held, else 1. */
static inline int check_report(const char *name) {
  printf("%s: %d checks, %d failed\n", name, checks, failures);
  return failures ? 1 : 0;
}

#endif /* RVM_TEST_CHECK_H */
