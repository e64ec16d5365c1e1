"""The benchmarks' own accounting: the profiler's FLOPs against XLA's cost analysis, the GPU
convolution count against hand-written HLO."""

import importlib.util
import json
import os
import subprocess
import sys

from conftest import REPO


def _load_profile_step():
    spec = importlib.util.spec_from_file_location("profile_step", REPO / "benchmarks" / "profile_step.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_valid_taps_hand_counts():
    taps = _load_profile_step()._valid_taps
    # 3-wide window, stride 1, one zero of padding each side, 4 inputs: the border outputs
    # see 2 real inputs, the inner ones 3.
    assert taps(4, 4, 3, 1, 1, 1, 1) == 2 + 3 + 3 + 2
    # stride 2 over 4 inputs, padding 1: outputs at input positions -1..1 and 1..3.
    assert taps(4, 2, 3, 2, 1, 1, 1) == 2 + 3
    # Transposed convolution of a stride-2 layer: 2 gradient values dilated to [g0, 0, g1],
    # padded (1, 2) to give 4 outputs, whose windows hold [g0], [g0, g1], [g1], [g1].
    assert taps(2, 4, 3, 1, 1, 2, 1) == 1 + 2 + 1 + 1
    # No padding, window = input: one output, every tap real (a weight-gradient shape).
    assert taps(8, 1, 8, 1, 0, 1, 1) == 8


def test_profile_step_convolution_flops_match_xla_cost_analysis():
    # At T = 1 XLA's cost analysis (which counts a while body once) is the whole step's FLOPs;
    # the profiler's per-convolution FLOPs must account for nearly all of it (the rest is
    # elementwise work and the dense layer) and never exceed it.
    env = dict(os.environ, PATJAX_CPU_DEVICES="1")
    out = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "profile_step.py"),
            "--model",
            "small_cnn",
            "--batch",
            "8",
            "--langevin-steps",
            "1",
            "--warmup",
            "1",
            "--json",
        ],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=300,
    ).stdout
    result = json.loads(out.strip().splitlines()[-1])
    assert result["devices"] == 1
    groups = {(g["phase"], g["kind"]): g for g in result["groups"]}
    conv_gflop = sum(g["gflop_per_device"] for g in result["groups"])
    total = result["xla_cost_analysis_gflop_per_device"]
    assert 0.9 * total <= conv_gflop <= total, (conv_gflop, total)
    # Both phases and every convolution direction were found in the trace and timed.
    for key in [
        ("sampler", "conv forward (library)"),
        ("sampler", "conv input-grad (library)"),
        ("update", "conv forward (library)"),
        ("update", "conv weight-grad (library)"),
    ]:
        assert groups[key]["ms_per_device"] > 0 and groups[key]["gflop_per_device"] > 0, key
    # At T = 1 the sampler runs one forward pass and the update one (train mode): the same
    # convolutions on the same batch, so the same FLOPs, found in two different phases.
    fwd = groups[("sampler", "conv forward (library)")]["gflop_per_device"]
    assert groups[("update", "conv forward (library)")]["gflop_per_device"] == fwd


def test_gpu_convolutions_counts_cudnn_calls_of_an_optimized_hlo():
    spec = importlib.util.spec_from_file_location("gpu_convolutions", REPO / "benchmarks" / "gpu_convolutions.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # Two lines as an H100's optimized HLO gave them (JAX 0.11.2; cut where the benchmark cuts
    # them), at the default precision and at 'highest', then hand-written ones: a bf16 input
    # gradient and weight gradient in TENSOR_OP_MATH, a GEMM and an elementwise op.
    hlo = "\n".join(
        [
            "%cudnn-conv.40 = (f32[256,32,32,64]{3,2,1,0}, u8[3152656]{0}) custom-call(%get-tuple-element.1948, "
            "%bitcast.169.0), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_o01i->b01f, "
            'custom_call_target="__cudnn$convForward", metadata={op_name="jit(train_step)/jvp()/while/body/'
            'eval_jaxpr/jvp(ResNet18)/Conv_0/conv_general_dilated" scheduling_name="cudnn-conv.40" '
            'stack_frame_id=121}, backend_config={"cudnn_conv_backend_config":{"activation_mode":"kNone",'
            '"algorithm":{"algo_id":"48","is_cudnn_frontend":false,"math_type":"DEFAULT_MATH","tuning_knobs":'
            '{"13":"2","14":"0","2":"2","22":"1","6":"0"},"workspace_s',
            "%cudnn-conv.40 = (f32[256,32,32,64]{3,2,1,0}, u8[0]{0}) custom-call(%get-tuple-element.1948, "
            "%bitcast.169.0), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_o01i->b01f, "
            'operand_precision={highest,highest}, custom_call_target="__cudnn$convForward", metadata={op_name='
            '"jit(train_step)/jvp()/while/body/eval_jaxpr/jvp(ResNet18)/Conv_0/conv_general_dilated" '
            'scheduling_name="cudnn-conv.40" stack_frame_id=113}, backend_config={"cudnn_conv_backend_config":'
            '{"activation_mode":"kNone","algorithm":{"algo_id":"28","is_cudnn_frontend":false,"math_type":'
            '"DEFAULT_MATH","tuning_knobs":{"2":"4","3":"0"},"workspa',
            "%cudnn-conv.7 = (bf16[256,32,32,64]{3,2,1,0}, u8[0]{0}) custom-call(%c, %d), "
            'custom_call_target="__cudnn$convBackwardInput", backend_config={"cudnn_conv_backend_config":'
            '{"algorithm":{"algo_id":"1","math_type":"TENSOR_OP_MATH"}}}',
            "%cudnn-conv.8 = (bf16[3,3,64,64]{3,2,1,0}, u8[0]{0}) custom-call(%e, %f), "
            'custom_call_target="__cudnn$convBackwardFilter", backend_config={"cudnn_conv_backend_config":'
            '{"algorithm":{"algo_id":"1","math_type":"TENSOR_OP_MATH"}}}',
            '%gemm.1 = (f32[256,10]{1,0}, s8[0]{0}) custom-call(%g, %h), custom_call_target="__cublas$gemm"',
            "%add.3 = f32[256,10]{1,0} add(%i, %j)",
        ]
    )
    assert module.convolutions(hlo) == {
        "f32 DEFAULT_MATH precision=default": 1,
        "f32 DEFAULT_MATH precision=highest,highest": 1,
        "bf16 TENSOR_OP_MATH precision=default": 2,
    }
    assert module.custom_calls(hlo) == {
        "__cudnn$convForward": 2,
        "__cudnn$convBackwardInput": 1,
        "__cudnn$convBackwardFilter": 1,
        "__cublas$gemm": 1,
    }
