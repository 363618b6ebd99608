"""The injected ops the GPU injection tests use (not a test module). One definition, so the warm child process
registers exactly what the test process did: the same op set gives the same generated source, hence the same
JIT cache key (zero NVRTC compiles in the child)."""

SQD_SRC = """
__device__ float sq(float x) { return x * x; }
__device__ float inj_sqd(float a, float b) { return sq(a - b); }
"""
MUL_SLOT1_SRC = "__device__ float mul(float a, float b) { return a * b + 1.0f; }"


def register_all(gpuos, wait=True):
    """Every op of the module in one generation (one worker compile). Returns {name: op id}."""
    ids = {}
    with gpuos.batch_install(wait=wait):
        ids["inj_axb1"] = gpuos.register_elementwise("inj_axb1", "a * b + 1.0f", arity=2, aten="aten::inj_axb1")
        ids["inj_sqd"] = gpuos.register_op("inj_sqd", SQD_SRC)
        ids["inj_lerp"] = gpuos.register_elementwise("inj_lerp", "a + s0 * (b - a) + c", arity=3)
        ids["inj_sw"] = gpuos.register_elementwise("inj_sw", "a + b")
        gpuos.install("inj_sw", "a - b", slot=1)
        ids["inj_ow"] = gpuos.register_elementwise("inj_ow", "a + b")
        gpuos.install("mul", MUL_SLOT1_SRC, slot=1)
        ids["inj_hypot"] = gpuos.register_elementwise("inj_hypot", "sqrtf(a * a + b * b)", arity=2,
                                                       aten="aten::hypot")
    return ids
