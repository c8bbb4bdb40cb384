// Cost of one clock reading on this VM: clock_gettime(CLOCK_BOOTTIME) (the
// one reading a GET makes), CLOCK_MONOTONIC, and rdtsc, in a loop of N,
// best of 7 loops.
#include <stdio.h>
#include <stdint.h>
#include <time.h>
#include <x86intrin.h>
#define N 2000000
static double now_ns(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e9+t.tv_nsec;}
static double loop(clockid_t id){struct timespec t;uint64_t s=0;double a=now_ns();for(int i=0;i<N;i++){clock_gettime(id,&t);s+=t.tv_nsec;}double b=now_ns();if(s==42)puts("");return (b-a)/N;}
static double loop_tsc(void){uint64_t s=0;double a=now_ns();for(int i=0;i<N;i++){s+=__rdtsc();}double b=now_ns();if(s==42)puts("");return (b-a)/N;}
static double loop_empty(void){volatile uint64_t s=0;double a=now_ns();for(int i=0;i<N;i++){s+=i;}double b=now_ns();return (b-a)/N;}
int main(void){
  double best[4]={1e9,1e9,1e9,1e9};
  for(int r=0;r<7;r++){
    double v[4]={loop(CLOCK_BOOTTIME),loop(CLOCK_MONOTONIC),loop_tsc(),loop_empty()};
    for(int k=0;k<4;k++) if(v[k]<best[k]) best[k]=v[k];
  }
  printf("CLOCK_BOOTTIME %.1f ns\nCLOCK_MONOTONIC %.1f ns\nrdtsc %.1f ns\nempty loop %.1f ns\n",best[0],best[1],best[2],best[3]);
}
