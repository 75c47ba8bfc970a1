"""A script workload written in TVMScript: single-head attention over a 128-token sequence.

abwatch calls ``workload(**options)`` in the build's own Python and times the module's
``main`` (see docs/workloads.md). With no inputs returned, seeded random inputs are made
from ``main``'s parameter shapes and dtypes.
"""

from tvm.script import ir as I
from tvm.script import relax as R


@I.ir_module
class Attention:
    @R.function
    def main(q: R.Tensor((128, 64), "float32"), k: R.Tensor((128, 64), "float32"),
             v: R.Tensor((128, 64), "float32")) -> R.Tensor((128, 64), "float32"):
        with R.dataflow():
            scores = R.matmul(q, R.permute_dims(k, [1, 0]))
            weights = R.nn.softmax(R.multiply(scores, R.const(0.125, "float32")), axis=-1)
            out = R.matmul(weights, v)
            R.output(out)
        return out


def workload():
    """The module to compile and time (shapes are fixed in the TVMScript above)."""
    return Attention
