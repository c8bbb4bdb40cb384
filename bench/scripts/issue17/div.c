// A home bucket's cost: 49-bit hash mod (2^18 - 1) homes (a 64-bit div) vs
// a mask with 2^18 homes, each result feeding the next hash (a dependent
// chain, as in a GET), N per loop, best of 7.
#include <stdio.h>
#include <stdint.h>
#include <time.h>
#define N 5000000
static double now_ns(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e9+t.tv_nsec;}
int main(int argc,char**argv){
  volatile uint64_t homes_v=(1u<<18)-1, mask_v=(1u<<18)-1;
  uint64_t homes=homes_v, mask=mask_v;
  double bd=1e9,bm=1e9;
  for(int r=0;r<7;r++){
    uint64_t h=0x123456789abcULL; double a=now_ns();
    for(int i=0;i<N;i++){h=((h*0x9E3779B97F4A7C15ULL)>>15)&((1ULL<<49)-1); h=h%homes+i; __asm__ volatile("" : "+r"(h));}
    double b=now_ns(); printf("%s", h==42?"x":"");
    uint64_t g=0x123456789abcULL; double c=now_ns();
    for(int i=0;i<N;i++){g=((g*0x9E3779B97F4A7C15ULL)>>15)&((1ULL<<49)-1); g=(g&mask)+i; __asm__ volatile("" : "+r"(g));}
    double d=now_ns(); printf("%s", g==42?"x":"");
    if((b-a)/N<bd)bd=(b-a)/N; if((d-c)/N<bm)bm=(d-c)/N;
  }
  printf("hash step + %% homes: %.2f ns\nhash step + mask: %.2f ns\ndifference (the div): %.2f ns\n",bd,bm,bd-bm);
}
