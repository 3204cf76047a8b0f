/* The instruction-set level of the CPU kernels, decided once at init.
 *
 * The library itself is compiled for a baseline that every x86-64 CPU of
 * the last fifteen years runs (x86-64-v2), so loading it never faults on an
 * older machine or under a tool that emulates fewer instructions. The
 * kernel files are compiled again for AVX2 and AVX-512 (cpu_impl.h), and
 * this file picks the set the machine runs, as OpenBLAS and oneDNN do:
 * cpuid must report the instructions and XCR0 must show that the OS saves
 * the wider registers on a context switch (a kernel without that support
 * leaves AVX-512 off even on a CPU that has it, and the instructions fault).
 * CT_CPU_ISA lowers the choice, so that one machine tests every level. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#define ISA_X86 1
#endif

#include "cpu_impl.h"

static const char *const level_names[CTI_ISA_COUNT] = {"baseline", "avx2", "avx512"};
static const char *const level_what[CTI_ISA_COUNT] = {
#ifdef ISA_X86
    "x86-64-v2",
#else
    "the compiler's default target",
#endif
    "x86-64-v3: AVX2, FMA, F16C", "x86-64-v4: AVX-512 F/BW/CD/DQ/VL"};

static cti_isa detected = CTI_ISA_BASELINE, chosen = CTI_ISA_BASELINE;
static bool avx512_bf16;
/* What CT_CPU_ISA asked for, kept for the info line: its text, and whether
 * it named a level. */
static char forced_text[32];
static bool forced_bad;

#ifdef ISA_X86
static unsigned long long xcr0(void) {
    unsigned int lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((unsigned long long)hi << 32) | lo;
}

#define BIT(r, n) (((r) >> (n)) & 1u)

static cti_isa detect(void) {
    unsigned int a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return CTI_ISA_BASELINE;
    bool fma = BIT(c, 12), movbe = BIT(c, 22), osxsave = BIT(c, 27), avx = BIT(c, 28),
         f16c = BIT(c, 29);
    if (!osxsave || !avx) return CTI_ISA_BASELINE;
    unsigned long long x = xcr0();
    if ((x & 0x6) != 0x6) return CTI_ISA_BASELINE; /* XMM and YMM state */
    if (__get_cpuid_max(0, NULL) < 7) return CTI_ISA_BASELINE;
    __cpuid_count(7, 0, a, b, c, d);
    unsigned int max_sub = a;
    bool bmi1 = BIT(b, 3), avx2 = BIT(b, 5), bmi2 = BIT(b, 8);
    bool avx512 = BIT(b, 16) && BIT(b, 17) && BIT(b, 28) && BIT(b, 30) && BIT(b, 31); /* F DQ CD BW VL */
    if (max_sub >= 1) {
        unsigned int a1, b1, c1, d1;
        __cpuid_count(7, 1, a1, b1, c1, d1);
        avx512_bf16 = BIT(a1, 5);
    }
    bool lzcnt = __get_cpuid(0x80000001, &a, &b, &c, &d) && BIT(c, 5);
    if (!(avx2 && fma && f16c && bmi1 && bmi2 && lzcnt && movbe)) return CTI_ISA_BASELINE;
    /* opmask, upper halves of ZMM0-15, ZMM16-31 */
    if (avx512 && (x & 0xE6) == 0xE6) return CTI_ISA_AVX512;
    avx512_bf16 = false;
    return CTI_ISA_AVX2;
}
#else
static cti_isa detect(void) { return CTI_ISA_BASELINE; }
#endif

void cti_cpu_isa_init(void) {
    detected = chosen = detect();
    const char *e = getenv("CT_CPU_ISA");
    if (!e || !*e) return;
    snprintf(forced_text, sizeof forced_text, "%s", e);
    for (int k = 0; k < CTI_ISA_COUNT; k++) {
        if (strcmp(e, level_names[k]) == 0) {
            if ((cti_isa)k < chosen) chosen = (cti_isa)k;
            return;
        }
    }
    forced_bad = true;
}

cti_isa cti_cpu_isa(void) { return chosen; }
cti_isa cti_cpu_isa_detected(void) { return detected; }
bool cti_cpu_has_avx512_bf16(void) { return chosen >= CTI_ISA_AVX512 && avx512_bf16; }

const char *cti_cpu_isa_name(cti_isa level) {
    return level >= 0 && level < CTI_ISA_COUNT ? level_names[level] : "?";
}

void cti_cpu_isa_describe(char *buf, size_t n) {
    char why[160];
    if (forced_bad)
        snprintf(why, sizeof why, "CT_CPU_ISA=%s is not a level (baseline, avx2, avx512), ignored",
                 forced_text);
    else if (forced_text[0] && chosen < detected)
        snprintf(why, sizeof why, "CT_CPU_ISA=%s; the CPU runs %s", forced_text,
                 level_names[detected]);
    else if (forced_text[0] && strcmp(forced_text, level_names[chosen]) != 0)
        snprintf(why, sizeof why, "CT_CPU_ISA=%s, but this CPU runs only %s", forced_text,
                 level_names[detected]);
    else
        snprintf(why, sizeof why, "the best this CPU and OS run; CT_CPU_ISA lowers it");
#ifdef CTI_CPU_NATIVE
    /* one kernel set; the level still gates the AVX-512 convolutions */
    snprintf(buf, n, "native (compiled with -march=native for the build machine); level %s (%s; %s)",
             level_names[chosen], level_what[chosen], why);
#else
    char built[64] = "";
#define NAME_(s) strncat(built, " " #s, sizeof built - strlen(built) - 1);
    CTI_CPU_KERNEL_SETS(NAME_)
#undef NAME_
    snprintf(buf, n, "%s (%s; %s; built:%s)", level_names[chosen], level_what[chosen], why,
             built);
#endif
}
