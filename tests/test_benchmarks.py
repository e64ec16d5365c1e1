"""The benchmarks' own accounting: the profiler's FLOPs against XLA's cost analysis, the GPU
convolution count against hand-written HLO."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest
from conftest import REPO


def _load_speed_script(name):
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / "speed" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _load_profile_step():
    return _load_speed_script("profile_step")


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


@pytest.mark.slow
def test_profile_step_convolution_flops_match_xla_cost_analysis(tmp_path):
    # At T = 1 XLA's cost analysis (which counts a while body once) is the whole step's FLOPs;
    # the profiler's per-convolution FLOPs must account for nearly all of it (the rest is
    # elementwise work and the dense layer) and never exceed it.
    env = dict(os.environ, PATJAX_CPU_DEVICES="1")
    out = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "speed" / "profile_step.py"),
            "--model",
            "small_cnn",
            "--batch",
            "8",
            "--langevin-steps",
            "1",
            "--warmup",
            "1",
            "--json",
            "--out",
            str(tmp_path / "summary.json"),
        ],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=300,
    ).stdout
    result = json.loads(out.strip().splitlines()[-1])
    assert json.loads((tmp_path / "summary.json").read_text()) == result
    assert result["devices"] == 1 and result["backend"] == "cpu"
    # The CPU trace runs through the same summary as a GPU trace: shares of the op time by class
    # add up to 1, top ops come slowest first.
    assert abs(sum(result["class_shares"].values()) - 1) < 1e-3 and result["class_shares"]["conv"] > 0
    shares = [r["share"] for r in result["top_ops"]]
    assert shares == sorted(shares, reverse=True) and len(shares) == 12
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
    spec = importlib.util.spec_from_file_location(
        "gpu_convolutions", REPO / "benchmarks" / "gpu" / "gpu_convolutions.py"
    )
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


# A GPU step's optimized HLO, cut to what the profile reads: a cuDNN forward convolution in the
# sampler's loop, its weight gradient in the update, an elementwise and a transpose fusion.
GPU_HLO = """\
%fused_add (param_0: f32[2,8,8,4]) -> f32[2,8,8,4] {
  %param_0 = f32[2,8,8,4]{3,2,1,0} parameter(0)
  ROOT %add.1 = f32[2,8,8,4]{3,2,1,0} add(%param_0, %param_0)
}

%fused_transpose (param_0.1: f32[2,8,8,4]) -> f32[2,4,8,8] {
  %param_0.1 = f32[2,8,8,4]{3,2,1,0} parameter(0)
  ROOT %transpose.2 = f32[2,4,8,8]{3,2,1,0} transpose(%param_0.1), dimensions={0,3,1,2}
}

ENTRY %main (p0: f32[2,8,8,3], p1: f32[3,3,3,4]) -> f32[2,4,8,8] {
  %p0 = f32[2,8,8,3]{3,2,1,0} parameter(0)
  %p1 = f32[3,3,3,4]{3,2,1,0} parameter(1)
  %cudnn-conv.1 = (f32[2,8,8,4]{3,2,1,0}, u8[0]{0}) custom-call(%p0, %p1), window={size=3x3 pad=1_1x1_1}, \
dim_labels=b01f_01io->b01f, custom_call_target="__cudnn$convForward", \
metadata={op_name="jit(train_step)/while/body/Conv_0/conv_general_dilated"}
  %gte.1 = f32[2,8,8,4]{3,2,1,0} get-tuple-element(%cudnn-conv.1), index=0
  %cudnn-conv.2 = (f32[3,3,3,4]{3,2,1,0}, u8[0]{0}) custom-call(%p0, %gte.1), window={size=3x3 pad=1_1x1_1}, \
dim_labels=b01f_01io->b01f, custom_call_target="__cudnn$convBackwardFilter", \
metadata={op_name="jit(train_step)/transpose(jvp(ResNet18))/Conv_0/conv_general_dilated"}
  %loop_add_fusion.3 = f32[2,8,8,4]{3,2,1,0} fusion(%gte.1), kind=kLoop, calls=%fused_add
  ROOT %transpose_fusion.4 = f32[2,4,8,8]{3,2,1,0} fusion(%loop_add_fusion.3), kind=kInput, calls=%fused_transpose
}
"""


def _gpu_trace():
    """A GPU trace as the profiler writes one (XSpace text form): kernels on two streams, each
    naming its HLO op (one leaves it out: the name must be derived from the kernel's), and a
    derived 'XLA Ops' line that repeats them and must not be counted."""
    from jax.profiler import ProfileData

    kernels = {1: "sm90_xmma_fprop_implicit_gemm_tf32f32", 2: "cudnn::detail::implicit_convolve_sgemm"}
    kernels.update({3: "loop_add_fusion_3", 4: "transpose_fusion_4", 5: "MemcpyD2H"})
    ops = {11: "cudnn-conv.1", 12: "cudnn-conv.2", 14: "transpose_fusion.4"}

    def event(kernel, start_ns, ns, op=None):
        stat = f"stats {{ metadata_id: 100 ref_value: {op} }}" if op else ""
        return f"events {{ metadata_id: {kernel} offset_ps: {start_ns * 1000} duration_ps: {ns * 1000} {stat} }}"

    stream = [
        event(1, 0, 4000, 11),
        event(1, 5000, 4000, 11),  # the sampler's convolution, twice (two loop iterations)
        event(2, 10000, 2000, 12),
        event(3, 12000, 1000),  # no hlo_op statistic
        event(4, 13000, 1000, 14),
    ]
    copies = [event(5, 3000, 2000)]  # overlaps the first convolution by 1000 ns
    derived = [event(1, 0, 9000, 11)]
    metadata = "".join(f'event_metadata {{ key: {k} value {{ id: {k} name: "{n}" }} }}' for k, n in kernels.items())
    metadata += 'stat_metadata { key: 100 value { id: 100 name: "hlo_op" } }'
    metadata += "".join(f'stat_metadata {{ key: {k} value {{ id: {k} name: "{n}" }} }}' for k, n in ops.items())
    lines = [("Stream #7(Compute)", stream), ("Stream #9(MemcpyD2H)", copies), ("XLA Ops", derived)]
    text = 'planes { id: 1 name: "/device:GPU:0" '
    for i, (name, events) in enumerate(lines):
        text += f'lines {{ id: {i + 1} name: "{name}" timestamp_ns: 0 {" ".join(events)} }} '
    return ProfileData.from_text_proto(text + metadata + " }")


def test_profile_step_reads_a_gpu_trace():
    module = _load_profile_step()
    instructions, computations = module.parse_hlo(GPU_HLO)
    result = module.summarize(module.trace_events(_gpu_trace()), instructions, computations, 1, 10)
    groups = {(g["phase"], g["kind"]): g for g in result["groups"]}
    # Forward 3x3 convolution, padding 1, 8x8 -> 8x8, 2 images, 3 -> 4 channels: 22 real taps per
    # axis (2 + 3 * 6 + 2), so 2 * 2 * 4 * 3 * 22 * 22 FLOPs; the weight gradient has the same.
    flops = 2 * 2 * 4 * 3 * 22 * 22
    forward = groups[("sampler", "conv forward (cudnn)")]
    assert forward["ms_per_device"] == 0.008 and forward["gflop_per_device"] == round(2 * flops / 1e9, 6)
    assert forward["gflops_per_s"] == round(2 * flops / 1e9 / 8e-6, 1)
    weight_grad = groups[("update", "conv weight-grad (cudnn)")]
    assert weight_grad["gflop_per_device"] == round(flops / 1e9, 6) and weight_grad["ms_per_device"] == 0.002
    assert groups[("update", "elementwise fusion")]["ms_per_device"] == 0.001  # named from its kernel
    assert groups[("update", "layout transpose/copy")]["ms_per_device"] == 0.001
    assert groups[("unattributed", "memcpy/memset")]["ms_per_device"] == 0.002
    assert result["op_ms_per_device"] == round((8000 + 2000 + 1000 + 1000 + 2000) / 1e6, 3)
    shares = result["class_shares"]
    assert shares["conv"] == round(10000 / 14000, 4) and shares["memcpy"] == round(2000 / 14000, 4)
    # The xmma kernel is a tensor-core kernel, implicit_convolve_sgemm is not: 8 of 10 us.
    assert result["conv_share_on_tensor_core_kernels"] == 0.8
    assert [k["tensor_core"] for k in result["conv_kernels"]] == [True, False]
    # Busy: 0-4000 and the copy to 5000, 5000-9000, 10000-14000.
    assert result["device_busy_ms"] == round((9000 + 4000) / 1e6, 3) and result["kernels"] == 6
    assert result["top_ops"][0]["op"] == "cudnn-conv.1" and result["top_ops"][0]["calls"] == 2


def test_compare_per_image_counts_each_flip_on_the_shared_images(tmp_path):
    """Two hand-made per_image files over overlapping images (A: 0-5, B: 2-7, in another order):
    on images 2-5, one clean prediction and one PGD outcome flipped, one PR count moved by 3,
    a loss moved by 0.25; the command line prints those numbers and refuses a file without
    image_index in one line."""
    import numpy as np

    a = {
        "image_index": np.arange(6),
        "clean.correct": np.array([1, 1, 1, 0, 1, 1], bool),
        "pgd20.robust": np.array([0, 1, 0, 0, 1, 0], bool),
        "pr_uniform.counts": np.array([[9, 9], [8, 8], [7, 7], [6, 6], [5, 5], [4, 4]], np.int32),
        "pr_uniform.lse_loss": np.zeros((6, 2), np.float32),
        "meta.seed": np.array(0),
    }
    order = np.array([7, 6, 5, 4, 3, 2])  # B's rows: images 7, 6, 5, 4, 3, 2
    b = {
        "image_index": order,
        "clean.correct": np.array([1, 1, 1, 1, 1, 1], bool),  # image 3: 0 -> 1
        "pgd20.robust": np.array([1, 1, 0, 0, 0, 0], bool),  # image 4: 1 -> 0 (7, 6 not shared)
        "pr_uniform.counts": np.array([[0, 0], [0, 0], [4, 4], [5, 2], [6, 6], [7, 7]], np.int32),  # image 4: -3
        "pr_uniform.lse_loss": np.zeros((6, 2), np.float32),
    }
    b["pr_uniform.lse_loss"][order == 2, 1] = 0.25
    np.savez(tmp_path / "a.npz", **a)
    np.savez(tmp_path / "b.npz", **b)
    spec = importlib.util.spec_from_file_location(
        "compare_per_image", REPO / "benchmarks" / "crosscheck" / "compare_per_image.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rows = {r[0]: r[1:] for r in module.compare(dict(np.load(tmp_path / "a.npz")), dict(np.load(tmp_path / "b.npz")))}
    assert rows == {
        "clean.correct": (4, 1, 1, None),
        "pgd20.robust": (4, 1, -1, None),
        "pr_uniform.counts": (4, 1, -3, None),
        "pr_uniform.lse_loss": (4, None, None, 0.25),
    }
    command = [sys.executable, str(REPO / "benchmarks" / "crosscheck" / "compare_per_image.py")]
    done = subprocess.run([*command, str(tmp_path / "a.npz"), str(tmp_path / "b.npz")], capture_output=True, text=True)
    assert done.returncode == 0 and "pr_uniform.counts" in done.stdout and "-3" in done.stdout
    np.savez(tmp_path / "c.npz", x=np.zeros(3))
    done = subprocess.run([*command, str(tmp_path / "a.npz"), str(tmp_path / "c.npz")], capture_output=True, text=True)
    assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_matched_accuracy_reads_curve_points_as_the_suite_does_and_interpolates_by_hand():
    """matched_accuracy.py on the committed table1_cpu runs of seed 1 (PAT's curve, PGD's final
    evaluation) gives the suite report's matched row to the last digit, and its point value is
    the linear interpolation written here with numpy: each model's clean accuracy and PR over its
    clean-correct images, PAT's curve sorted by accuracy, read at PGD's accuracy."""
    import numpy as np

    runs = REPO / "docs" / "results" / "table1_cpu" / "runs" / "cifar10_small_cnn"
    out = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "crosscheck" / "matched_accuracy.py"), "--a", str(runs / "pat_s1")]
        + ["--b", str(runs / "pgd_s1"), "--final=eval"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    row = json.loads(out)
    suite = json.loads((REPO / "docs" / "results" / "table1_cpu" / "results.json").read_text())
    expected = suite["matched"][0]["per_seed"]["1"]
    assert row["matched_accuracy"] == expected["matched_accuracy"]
    for eps, figure in row["pr_difference"].items():
        assert figure["value"] == expected["pr_clean_correct"][eps]["value"]
        assert figure["interval"] == expected["pr_clean_correct"][eps]["interval"]

    def figures(folder):
        z = np.load(folder / "per_image.npz")
        correct, pr = z["clean.correct"].astype(bool), z["pr_uniform.counts"] / 100
        return correct.mean(), pr[correct].mean(axis=0)

    points = [figures(p) for p in sorted((runs / "pat_s1" / "curve").iterdir())] + [figures(runs / "pat_s1" / "eval")]
    points.sort(key=lambda p: p[0])
    accuracy_b, pr_b = figures(runs / "pgd_s1" / "eval")
    by_hand = np.interp(accuracy_b, [a for a, _ in points], [p[3] for _, p in points]) - pr_b[3]
    assert abs(row["pr_difference"]["0.2"]["value"] - by_hand) < 1e-12


def test_the_new_user_path_runs_its_four_steps_as_separate_commands_on_a_copy(tmp_path):
    spec = importlib.util.spec_from_file_location("new_user_path", REPO / "benchmarks" / "speed" / "new_user_path.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    steps = module.commands("W", 1000, ["--num_examples=8"])
    assert [step for step, _ in steps] == ["linf", "l2", "prbench", "certify"]
    assert [argv[1:] for _, argv in steps] == [
        ["-m", "patjax.evaluate", "--workdir=W", "--num_examples=8"],
        ["-m", "patjax.evaluate", "--workdir=W", "--attack_norm=l2", "--num_examples=8"],
        ["-m", "patjax.evaluate", "--workdir=W", "--pr_preset=prbench", "--num_examples=8"],
        [
            "-m",
            "patjax.evaluate",
            "--workdir=W",
            "--evaluators=clean,certify",
            "--certify_sigma=0.25",
            "--eval_name=certify",
            "--certify_samples=1000",
            "--num_examples=8",
        ],
    ]
    run = tmp_path / "run"
    (run / "eval").mkdir(parents=True)
    (run / "config.json").write_text("{}")
    copy = module.fresh_copy(str(run), str(tmp_path / "scratch"))
    assert os.listdir(copy) == ["config.json"] and (run / "eval").is_dir()  # the run itself untouched
    with pytest.raises(SystemExit):
        module.main(["--run", str(tmp_path / "nothing"), "--dry_run"])


@pytest.mark.slow
def test_epoch_throughput_counts_t_sampler_steps_of_pat_from_the_uniform_start():
    # PAT from the uniform start with T = 0 is refused, so the count cannot lower that step; it
    # must still grow by one sampler step per step of T, the loop body XLA counts once.
    et = _load_speed_script("epoch_throughput")
    args = et.parse_args(["--model", "small_cnn", "--batch", "8", "--langevin-steps", "10"])
    assert args.langevin_init == "uniform" and args.method == "pat"
    placed = et.build(args, 1)[1:]

    def flops(steps):
        at = et.parse_args(["--model", "small_cnn", "--batch", "8", "--langevin-steps", str(steps)])
        return et.step_flops(at, et.build(at, steps)[0].lower(*placed), placed)

    f1, f2, f10 = flops(1), flops(2), flops(10)
    assert 0 < f1 < f2 and f10 - f1 == 9 * (f2 - f1)
