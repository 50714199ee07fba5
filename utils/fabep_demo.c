/* fabep_demo.c - placeholder */
#include "config.h"
#include <stdio.h>
int main(void) { fprintf(stderr, "fabep_demo: not ready yet\n"); return 1; }
