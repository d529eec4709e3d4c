"""Helpers of the metaschedule measurement tests: kernel libraries that fail on purpose."""
import shutil
import subprocess

from capabilities import GCC, requires
from tilecraft.metaschedule.arg_info import ArgInfo

# A kernel library with the real ABI whose main(A, B) crashes in the ways a bad kernel can.
FAULTY_C = r"""
#include <stdint.h>
#include <stdlib.h>
const int32_t tilecraft_abi_version = 1;
int32_t tilecraft_num_threads = 1;
const char tilecraft_metadata[] =
  "{\"abi_version\": 1, \"target\": \"llvm\", \"triple\": \"host\", \"num_cores\": 1,"
  " \"entry\": \"main\", \"functions\": [{\"name\": \"main\", \"symbol\": \"tilecraft_fn_main\","
  " \"shape_vars\": [], \"params\": ["
  "{\"name\": \"A\", \"kind\": \"buffer\", \"dtype\": \"float32\", \"shape\": [16], \"symbolic\": [false], \"written\": false},"
  "{\"name\": \"B\", \"kind\": \"buffer\", \"dtype\": \"float32\", \"shape\": [16], \"symbolic\": [false], \"written\": true}]}]}";
const char *tilecraft_get_last_error(void) { return ""; }
int32_t tilecraft_fn_main(void *args, int32_t *codes, int32_t n) {
#if defined(CRASH)
  volatile int32_t *p = (volatile int32_t *)0;   /* NULL dereference: SIGSEGV */
  return *p;
#elif defined(ABORT)
  abort();
#else
  volatile uint64_t i = 0;                        /* never returns */
  for (;;) i++;
#endif
  return 0;
}
"""
ELEMWISE_INFOS = [ArgInfo((16,), "float32"), ArgInfo((16,), "float32")]




def build_faulty_libraries(directory) -> dict:
    """``{"crash": path, "abort": path, "spin": path}``: FAULTY_C compiled three ways (the test
    ``requires`` a C compiler)."""
    requires(*GCC)
    cc = shutil.which("gcc") or shutil.which("cc")
    src = directory / "faulty.c"
    src.write_text(FAULTY_C)
    out = {}
    for kind in ("CRASH", "ABORT", "SPIN"):
        lib = directory / f"{kind.lower()}.so"
        subprocess.run([cc, "-shared", "-fPIC", "-O1", f"-D{kind}", "-o", str(lib), str(src)],
                       check=True, capture_output=True, timeout=60)
        out[kind.lower()] = str(lib)
    return out
