/* Cost of the back-off primitives on this machine: nanosleep(1 us) with several timer slacks,
 * sched_yield() with nothing else runnable, clock_gettime. gcc -O2 bench/sleep_cost.c -o /tmp/sleep_cost */
#define _GNU_SOURCE
#include <stdio.h>
#include <time.h>
#include <sched.h>
#include <sys/prctl.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e9+t.tv_nsec;}
int main(void){
  long slacks[]={50000,1000,1};
  for(int s=0;s<3;s++){ prctl(PR_SET_TIMERSLACK,slacks[s],0,0,0);
    struct timespec ts={0,1000}; double t=now(); for(int i=0;i<2000;i++) nanosleep(&ts,NULL);
    printf("slack %ld ns: nanosleep(1us) takes %.1f us\n",slacks[s],(now()-t)/2000/1000);}
  double t=now(); for(int i=0;i<200000;i++) sched_yield(); printf("sched_yield (nothing else runnable): %.2f us\n",(now()-t)/200000/1000);
  t=now(); for(int i=0;i<2000000;i++) { struct timespec x; clock_gettime(CLOCK_MONOTONIC,&x);} printf("clock_gettime: %.1f ns\n",(now()-t)/2000000);
}
