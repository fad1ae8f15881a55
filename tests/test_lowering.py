"""benchmarks.lowering: the trainer's steps lowered for tpu and cuda from this CPU (tiny BERT, scratch encoder)."""

import pytest

from benchmarks import lowering
from gp_jax import aot
from gp_jax.ops import attention as attention_lib


def _lines(capsys, *args):
  code = lowering.main(["--platforms=tpu,cuda", "--tiny", "--batch=8", "--length=128", "--mesh=data:4,fsdp:2",
                        "--targets=train_step,eval_step", *args])
  return code, capsys.readouterr().out.strip().splitlines()


def _cuda_attention():
  return "cudnn" if attention_lib.cudnn_detected() else f"xla: {aot.CUDNN_MISSING} on this machine"


@pytest.mark.parametrize("model,layers", [("bert-base", lowering.TINY_BERT["num_hidden_layers"]), ("scratch", 1)])
def test_steps_lower_for_tpu_and_cuda(capsys, model, layers):
  code, lines = _lines(capsys, f"--model={model}")
  # splash: forward per layer in eval; forward, dq and dkv kernels per layer in training
  cuda_calls = lambda n: n if attention_lib.cudnn_detected() else 0  # noqa: E731
  assert lines == [
      f"tpu train_step: lowered (bfloat16, splash, {3 * layers} custom calls)",
      f"tpu eval_step: lowered (bfloat16, splash, {layers} custom calls)",
      f"cuda train_step: lowered (bfloat16, {_cuda_attention()}, {cuda_calls(2 * layers)} custom calls)",
      f"cuda eval_step: lowered (bfloat16, {_cuda_attention()}, {cuda_calls(layers)} custom calls)",
  ]
  assert code == 0


def test_the_pallas_loss_target(capsys):
  code, lines = _lines(capsys, "--model=scratch", "--targets=loss")
  assert code == 0  # the cuda refusal is a known reason
  assert lines[0] == "tpu loss: lowered (pallas, 3 tpu_custom_call)"
  assert lines[1].startswith("cuda loss: not lowered: RuntimeError: refused: loss.implementation=pallas has no GPU "
                             "kernel")


def test_attention_dropout_and_short_lengths_take_the_xla_path(capsys):
  code, lines = _lines(capsys, "--model=scratch", "--length=64", "--platforms=tpu")
  assert code == 0
  assert lines == ["tpu train_step: lowered (bfloat16, xla: L=64 is not a multiple of 128, 0 custom calls)",
                   "tpu eval_step: lowered (bfloat16, xla: L=64 is not a multiple of 128, 0 custom calls)"]
  code, lines = _lines(capsys, "--model=scratch", "--attention-dropout=0.1", "--platforms=tpu")
  assert lines[0] == ("tpu train_step: lowered (bfloat16, xla: attention dropout is on (splash has no probability "
                      "dropout), 0 custom calls)")
  assert lines[1] == "tpu eval_step: lowered (bfloat16, splash, 1 custom calls)"


def test_unexpected_errors_exit_nonzero_and_known_reasons_do_not(capsys):
  problem = lowering.make_problem("scratch", batch=8, length=128, mesh_sizes={"data": 8, "fsdp": 1}, tiny=True)

  def broken(problem, platform):
    raise KeyError("surprise")

  def too_long(problem, platform):
    raise ValueError("sequence length 600 exceeds the 512 positions this encoder was trained with")

  broken.__name__, too_long.__name__ = "broken", "too_long"
  lines, ok = lowering.run(problem, ["tpu"], targets=[too_long])
  assert ok and lines == ["tpu too_long: not lowered: ValueError: sequence length 600 exceeds the 512 positions "
                          "this encoder was trained with"]
  lines, ok = lowering.run(problem, ["tpu"], targets=[broken])
  assert not ok and lines == ["tpu broken: not lowered: KeyError: 'surprise'"]
  capsys.readouterr()


def test_kernel_calls_count_call_sites():
  text = """module @jit_f {
  func.func public @main(%arg0: tensor<f32>) -> tensor<f32> {
    %0 = call @layer(%arg0) : (tensor<f32>) -> tensor<f32>
    %1 = func.call @layer(%0) : (tensor<f32>) -> tensor<f32>
    %2 = stablehlo.custom_call @Sharding(%1) : (tensor<f32>) -> tensor<f32>
    return %2 : tensor<f32>
  }
  func.func private @layer(%arg0: tensor<f32>) -> tensor<f32> {
    %0 = stablehlo.custom_call @tpu_custom_call(%arg0) : (tensor<f32>) -> tensor<f32>
    %1 = stablehlo.custom_call @__cudnn$fmhaSoftmax(%0) : (tensor<f32>) -> tensor<f32>
    return %1 : tensor<f32>
  }
}"""
  assert aot.kernel_calls(text) == {"splash": 2, "cudnn": 2}
