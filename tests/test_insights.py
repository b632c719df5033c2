"""LogInsights on real log excerpts (tests/fixtures/logs, see SOURCES.md) and on edge cases."""

from __future__ import annotations

import json
import random
import tracemalloc
from pathlib import Path

import pytest

from gputui.core.insights import (
    LOSS_HISTORY,
    MAX_LINE,
    MAX_METRICS,
    Hint,
    JobInsights,
    LogInsights,
    hint_for_exit,
    hints_from_metrics,
)

LOGS = Path(__file__).parent / "fixtures" / "logs"

HINT_FIXTURES = {
    "cuda_oom_torch2.log": "cuda_oom",
    "cuda_oom_exception.log": "cuda_oom",
    "cuda_oom_legacy.log": "cuda_oom",
    "no_kernel_image.log": "no_kernel_image",
    "sm120_unsupported.log": "no_kernel_image",
    "driver_too_old.log": "cuda_driver_too_old",
    "driver_insufficient.log": "cuda_driver_too_old",
    "cuda_init_warning.log": "cuda_unavailable",
    "nccl_error.log": "nccl_error",
    "dataloader_bus_error.log": "dataloader_worker",
    "dataloader_shm_mmf.log": "dataloader_worker",
    "no_space.log": "disk_full",
    "killed_tqdm.log": "host_oom",
    "killed_plain.log": "host_oom",
    "checkpoint_write_failed.log": "checkpoint_write",
    "checkpoint_write_tqdm.log": "checkpoint_write",
    "nccl_warn_ibv.log": "nccl_network",
    "device_side_assert.log": "cuda_device_assert",
    "tensors_devices.log": "device_mismatch",
    "shm_no_space.log": "shm_full",
    "nanogpt_nan.log": "loss_nan",
    "torchrun_sigkill.log": "host_oom",
}
CLEAN_FIXTURES = [
    "nccl_info_clean.log",
    "hf_trainer_tf.log",
    "hf_trainer_eval.log",
    "hf_eval_metrics.log",
    "paddlenlp_tqdm_mixed.log",
    "lightning_progress.log",
    "lightning_colab.log",
    "detectron2_events.log",
    "graphstorm_epochs.log",
    "keras_fit.log",
    "mmengine_epochs.log",
    "mmdet_epochs.log",
    "lm_batches.log",
    "yolov8_epochs.log",
    "mmengine_val.log",
    "nanogpt_iters.log",
    "openpcdet_timm_style.log",
    "keras_evaluate.log",
    "keras3_evaluate_print.log",
    "fairseq_epochs.log",
    "deepspeed_steps.log",
    "tqdm_recorded.log",
    "lightning_rich.log",
    "torchtune_lora.log",
    "megatron_iterations.log",
]
MNIST_LINE = b"Epoch 2/5 train_loss=0.1234 test_loss=0.0567 test_acc=0.9812 lr=0.001 time=12.3s\n"


def parse(data: bytes, chunk: int | None = None) -> JobInsights:
    ins = LogInsights(clock=lambda: 0.0)
    if chunk is None:
        ins.feed(data)
    else:
        for i in range(0, len(data), chunk):
            ins.feed(data[i : i + chunk])
    return ins.snapshot()


def read(name: str) -> bytes:
    return (LOGS / name).read_bytes()


def codes(snap: JobInsights) -> list[str]:
    return [h.code for h in snap.hints]


# ---- hints on real excerpts ------------------------------------------------------------------


def test_every_fixture_is_listed_in_sources() -> None:
    sources = (LOGS / "SOURCES.md").read_text()
    names = {p.name for p in LOGS.glob("*.log")}
    assert names == set(HINT_FIXTURES) | set(CLEAN_FIXTURES)
    for name in names:
        assert f"`{name}`" in sources


@pytest.mark.parametrize(("name", "code"), sorted(HINT_FIXTURES.items()))
def test_hint_fires_on_real_excerpt(name: str, code: str) -> None:
    snap = parse(read(name))
    assert codes(snap) == [code]
    hint = snap.hints[0]
    assert hint.title and len(hint.title) < 60
    assert 40 < len(hint.fix) < 420
    assert hint.line and len(hint.line) <= 300
    assert hint.line in read(name).decode() or hint.line.endswith("…")


@pytest.mark.parametrize("name", CLEAN_FIXTURES)
def test_no_hint_on_clean_training_output(name: str) -> None:
    assert parse(read(name)).hints == ()


def test_no_hint_on_mnist_example_run() -> None:
    assert parse(mnist_run()).hints == ()


def test_hint_fixes_are_specific() -> None:
    fixes = {h.code: h.fix for name in HINT_FIXTURES for h in parse(read(name)).hints}
    assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in fixes["cuda_oom"]
    assert "batch size" in fixes["cuda_oom"] and "bf16" in fixes["cuda_oom"]
    assert "NCCL_DEBUG=INFO" in fixes["nccl_error"] and "NCCL_SOCKET_IFNAME" in fixes["nccl_error"]
    assert "--shm-size" in fixes["dataloader_worker"] and "num_workers" in fixes["dataloader_worker"]
    assert "get_arch_list" in fixes["no_kernel_image"]
    assert "dmesg" in fixes["host_oom"]


def test_oom_hint_names_the_allocation() -> None:
    hint = parse(read("cuda_oom_torch2.log")).hints[0]
    assert "30.29 GiB" in hint.fix


def test_arch_hint_names_the_gpu_arch() -> None:
    hint = parse(read("sm120_unsupported.log")).hints[0]
    assert "sm_120" in hint.fix
    assert "sm_120" in hint.line


def test_dataloader_hint_tells_shm_from_ram() -> None:
    shm = parse(read("dataloader_bus_error.log")).hints[0]
    assert "shared memory" in shm.title
    ram = parse(b"RuntimeError: DataLoader worker (pid 7) is killed by signal: Killed.\n").hints[0]
    assert ram.code == "dataloader_worker" and "RAM" in ram.fix


def test_shm_full_is_not_the_disk() -> None:
    shm = parse(read("shm_no_space.log")).hints[0]
    assert "--shm-size" in shm.fix and "/dev/shm" in shm.title
    disk = parse(read("no_space.log")).hints[0]
    assert disk.code == "disk_full" and "save_total_limit" in disk.fix


def test_new_hints_name_the_fix() -> None:
    fixes = {h.code: h.fix for name in HINT_FIXTURES for h in parse(read(name)).hints}
    assert (
        "CUDA_LAUNCH_BLOCKING=1" in fixes["cuda_device_assert"]
        and "num_classes" in fixes["cuda_device_assert"]
    )
    assert "NCCL_IB_DISABLE=1" in fixes["nccl_network"] and "memlock" in fixes["nccl_network"]
    assert "model.to(device)" in fixes["device_mismatch"]
    assert "df -h" in fixes["checkpoint_write"]


def test_sigkill_with_a_killed_log_is_one_hint_with_its_evidence() -> None:
    from gputui.core.insights import with_exit_hint

    hints = with_exit_hint(parse(read("killed_plain.log")).hints, 137)
    assert [h.code for h in hints] == ["host_oom"]
    assert "Killed" in hints[0].line and "exit code 137" in hints[0].line
    assert [h.code for h in with_exit_hint((), 137)] == ["exit_sigkill"]
    assert [h.code for h in with_exit_hint(parse(read("no_space.log")).hints, -9)] == [
        "disk_full",
        "exit_sigkill",
    ]


def test_hints_are_deduplicated_by_code() -> None:
    data = read("cuda_oom_legacy.log") * 3 + read("cuda_oom_exception.log")
    snap = parse(data)
    assert codes(snap) == ["cuda_oom"]
    assert "1006.00 MiB" in snap.hints[0].line  # the first occurrence is kept


def test_hints_from_several_failures_keep_their_order() -> None:
    snap = parse(read("no_space.log") + read("killed_plain.log"))
    assert codes(snap) == ["disk_full", "host_oom"]


# ---- progress --------------------------------------------------------------------------------


def test_tqdm_carriage_return_redraws_latest_state_wins() -> None:
    lines = read("lightning_progress.log").splitlines()
    snap = parse(b"".join(b"\r" + line for line in lines))  # tqdm writes "\r<bar>"
    assert snap.step == 5 and snap.total_steps == 18
    assert snap.progress == pytest.approx(5 / 18)
    assert snap.eta_s == 53.0
    assert snap.rate == "4.14s/it"
    assert snap.epoch == 1  # Lightning's "Epoch 0", counted from 1
    # the newest redraw has no line end yet: it counts for progress, last_line is the previous one
    assert snap.last_line == lines[-2].decode().strip()
    assert snap.metrics["loss"]["last"] == 9.926


def test_unfinished_redraw_counts_only_when_complete() -> None:
    done = " 40%|████      | 400/1000 [00:10<00:15, 40.0it/s]\r".encode()
    cut = " 45%|████▌     | 450/1000 [00:12<00:1".encode()
    assert parse(done + cut).progress == 0.4  # the cut redraw is not read yet
    assert parse(done + cut + b"5, 36.1it/s]").progress == 0.45


def test_tqdm_postfix_loss_counts_each_new_value_once() -> None:
    snap = parse(read("lightning_progress.log"))
    assert snap.metrics["loss"] == {"last": 9.847, "best": 9.847, "count": 5}
    assert snap.loss_history == (10.473, 10.224, 10.047, 9.926, 9.847)
    assert "v_num" not in snap.metrics


def test_tqdm_without_description_and_rates() -> None:
    bar = " 45%|████▌     | 450/1000 [00:12<00:15, 36.1it/s]".encode()
    for data in (bar, b"\r" + bar, bar + b"\r", bar + b"\n"):
        snap = parse(data)
        assert (snap.progress, snap.eta_s, snap.rate) == (0.45, 15.0, "36.1it/s")
        assert (snap.step, snap.total_steps) == (450, 1000)


def test_tqdm_unknown_total() -> None:
    snap = parse(b"Training: 0it [00:00, ?it/s]\r123it [00:05, 24.1it/s]\n")
    assert snap.progress is None and snap.eta_s is None
    assert snap.step == 123 and snap.total_steps is None
    assert snap.rate == "24.1it/s"


def test_tqdm_colab_style_without_bar_glyphs() -> None:
    snap = parse(read("lightning_colab.log"))
    assert snap.progress == pytest.approx(1658 / 1702)
    assert snap.eta_s == 20.0
    assert snap.metrics["train_loss"]["last"] == 0.149


def test_bar_followed_by_a_glued_log_line() -> None:
    snap = parse(read("paddlenlp_tqdm_mixed.log"))
    assert (snap.step, snap.total_steps) == (200, 600)
    assert snap.progress == pytest.approx(1 / 3)
    assert snap.eta_s == 118.0


def test_text_glued_after_a_bar_is_read() -> None:
    log = " 100%|██████████| 10/10 [00:01<00:00,  9.0it/s]Epoch 1/5 train_loss=0.3000 test_acc=0.9\n"
    snap = parse(log.encode())
    assert snap.metrics["train_loss"]["last"] == 0.3 and snap.metrics["test_acc"]["last"] == 0.9
    assert (snap.epoch, snap.total_epochs) == (1, 5)
    assert snap.progress == pytest.approx(0.2)


def test_eval_bar_does_not_take_over_the_training_bar() -> None:
    log = (
        " 33%|███▎      | 500/1500 [01:00<02:00,  8.3it/s]\r"
        "\n 20%|██        | 10/50 [00:01<00:04,  9.9it/s]\r"
        "Validation DataLoader 0: 100%|██████████| 50/50 [00:05<00:00,  9.5it/s]\n"
    )
    snap = parse(log.encode())
    assert snap.progress == pytest.approx(1 / 3)
    assert snap.rate == "8.3it/s"


def test_download_bars_are_ignored() -> None:
    snap = parse(b"Downloading model.safetensors:  10%|#         | 52.4M/524M [00:02<00:18, 26.2MB/s]\n")
    assert snap.progress is None


def test_epoch_i_of_n_and_ansi() -> None:
    snap = parse(b"\x1b[32mepoch 3 of 10\x1b[0m\n")
    assert (snap.epoch, snap.total_epochs) == (3, 10)
    assert snap.progress == pytest.approx(0.2)  # epoch 3 has just started
    assert snap.last_line == "epoch 3 of 10"


def test_mnist_example_line() -> None:
    snap = parse(MNIST_LINE)
    assert (snap.epoch, snap.total_epochs) == (2, 5)
    assert snap.progress == pytest.approx(0.4)  # the line summarises a finished epoch
    assert snap.eta_s == pytest.approx(3 * 12.3)  # from the per-epoch time
    m = snap.metrics
    assert m["train_loss"]["last"] == 0.1234
    assert m["test_loss"]["last"] == 0.0567
    assert m["test_acc"]["last"] == 0.9812
    assert m["lr"]["last"] == 0.001
    assert m["time"]["last"] == 12.3
    assert snap.loss_history == (0.1234,)


def mnist_run() -> bytes:
    """What examples/train_mnist.py prints: header, a tqdm bar per epoch (leave=False), summary."""
    out = [
        b"gputui MNIST example: torch 2.4.1, torchvision 0.19.1\n",
        b"Device: cuda (NVIDIA H100 80GB HBM3) amp=fp16\n",
        b"Data: 60000 train / 10000 test images from data; epochs=5 batch_size=128 lr=0.001 out=runs/m\n",
    ]
    for epoch in (1, 2):
        for n in (0, 117, 235, 469):
            pct = n * 100 // 469
            bar = "█" * (pct // 10) + " " * (10 - pct // 10)
            post = f", loss={0.5 / epoch - n / 10000:.4f}" if n else ""
            rate = "?batch/s" if n == 0 else "60.1batch/s"
            out.append(
                f"\rEpoch {epoch}/5: {pct:3d}%|{bar}| {n}/469 [00:{n // 60:02d}<00:{(469 - n) // 60:02d}, {rate}{post}]".encode()
            )
        out.append(b"\r\x1b[K")
        out.append(
            f"Epoch {epoch}/5 train_loss={0.3 / epoch:.4f} test_loss={0.1 / epoch:.4f} "
            f"test_acc={0.95 + epoch / 100:.4f} lr=0.001 time=8.0s\n".encode()
        )
    return b"".join(out)


def test_mnist_example_run_overall_progress() -> None:
    data = mnist_run()
    cut = data.index(b"\rEpoch 2/5: 100%")
    mid = parse(data[:cut])  # the 235/469 redraw is the newest, still without a line end
    assert mid.epoch == 2 and mid.total_epochs == 5
    assert mid.progress == pytest.approx((1 + 235 / 469) / 5)  # (epoch-1 + inner fraction) / N
    assert mid.eta_s == pytest.approx(3 + 3 * (3 + 3))  # rest of this epoch + 3 epochs of 3+3 s
    end = parse(data)
    assert end.progress == pytest.approx(2 / 5)
    assert end.eta_s == pytest.approx(3 * 8.0)
    assert end.metrics["test_acc"] == {"last": 0.97, "best": 0.97, "count": 2}
    assert end.metrics["train_loss"]["best"] == 0.15


def test_mnist_fallback_ascii_bar() -> None:
    snap = parse(b"\rEpoch 2/5 [#########.....................]  30% loss=0.1234\r")
    assert (snap.epoch, snap.total_epochs) == (2, 5)
    assert snap.progress == pytest.approx((1 + 0.3) / 5)
    assert snap.metrics["loss"]["last"] == 0.1234


def test_inner_count_next_to_epoch() -> None:
    snap = parse(read("no_space.log"))
    assert (snap.epoch, snap.total_epochs) == (55, 167)
    assert snap.progress == pytest.approx((54 + 996 / 1926) / 167)
    assert snap.metrics["loss"] == {"last": 0.2907, "best": 0.2836, "count": 5}


def test_keras_fit_lines() -> None:
    snap = parse(read("keras_fit.log"))
    assert (snap.epoch, snap.total_epochs) == (3, 10)
    assert snap.progress == pytest.approx(0.3)  # epoch 3's bar is complete
    assert snap.metrics["loss"] == {"last": 0.5045, "best": 0.5045, "count": 3}
    assert snap.metrics["val_top_k_categorical_accuracy"]["best"] == 1.0
    assert snap.loss_history == (0.6284, 0.5469, 0.5045)


def test_keras_bar_in_progress() -> None:
    snap = parse(
        b"Epoch 2/5\n 61/82 [=====================>........] - ETA: 37s - loss: 0.6016 - accuracy: 0.9260\r"
    )
    assert snap.progress == pytest.approx((1 + 61 / 82) / 5)
    assert snap.eta_s == 37.0
    assert snap.metrics["accuracy"]["last"] == 0.926


def test_mmengine_and_mmdet_lines() -> None:
    snap = parse(read("mmengine_epochs.log"))
    assert snap.epoch == 1 and (snap.step, snap.total_steps) == (30, 90)
    assert snap.progress == pytest.approx(30 / 90)
    assert snap.eta_s == 9.0
    assert snap.metrics["loss"]["best"] == -6.0185
    snap = parse(read("mmdet_epochs.log"))
    assert snap.eta_s == 86400 + 16 * 3600 + 52 * 60 + 19  # "eta: 1 day, 16:52:19"
    assert snap.metrics["s0.acc"] == {"last": 80.6641, "best": 92.1875, "count": 2}
    assert snap.loss_history == (3.013, 2.8716)  # the total "loss", not loss_rpn_cls
    assert "memory" not in snap.metrics


def test_classic_epoch_step_loss_line() -> None:
    snap = parse(b"Epoch [2/10], Step [100/600], Loss: 0.2345\n")
    assert (snap.epoch, snap.total_epochs) == (2, 10)
    assert (snap.step, snap.total_steps) == (100, 600)
    assert snap.progress == pytest.approx((1 + 100 / 600) / 10)
    assert snap.metrics["loss"]["last"] == 0.2345


def test_flush_reads_the_unfinished_last_line() -> None:
    ins = LogInsights(clock=lambda: 0.0)
    ins.feed(b"Epoch 0/1\nKilled")
    assert ins.snapshot().hints == ()
    ins.flush()
    assert codes(ins.snapshot()) == ["host_oom"]
    assert ins.snapshot().last_line == "Killed"


def test_log_eta_without_progress() -> None:
    snap = parse(read("detectron2_events.log"))
    assert snap.progress is None
    assert snap.eta_s == 19 * 3600 + 46 * 60 + 57
    assert snap.metrics["total_loss"] == {"last": 9.924, "best": 9.924, "count": 2}
    assert "max_mem" not in snap.metrics
    assert snap.loss_history == (10.31, 9.924)


def test_eta_from_elapsed_rate() -> None:
    now = [0.0]
    ins = LogInsights(clock=lambda: now[0])
    ins.feed(b"Epoch 1/4 loss=1.0\n")
    now[0] = 10.0
    ins.feed(b"Epoch 2/4 loss=0.8\n")
    snap = ins.snapshot()
    assert snap.progress == 0.5
    assert snap.eta_s == pytest.approx(20.0)  # 0.25 per 10 s, 0.5 left


def test_eta_rate_ignores_a_replayed_log() -> None:
    now = [100.0]
    ins = LogInsights(clock=lambda: now[0])
    for epoch in (1, 2):  # catching up on an existing log: lines arrive in one burst
        ins.feed(f"Epoch {epoch}/4 loss=0.5\n".encode())
        now[0] += 0.01
    now[0] = 130.0
    ins.feed(b"Epoch 3/4 loss=0.4\n")
    assert ins.snapshot().eta_s == pytest.approx(30.0, abs=0.1)  # one epoch took 30 s in real time


# ---- HF Trainer dicts, JSON lines, metrics -----------------------------------------------------


def test_hf_trainer_dict_lines() -> None:
    snap = parse(read("hf_trainer_tf.log"))
    assert snap.total_epochs == 3
    assert (snap.step, snap.total_steps) == (100, 564)
    assert snap.progress == pytest.approx(100 / 564)
    assert snap.epoch == 1  # 'epoch': 0.537 is inside the first epoch
    assert snap.metrics["loss"] == {"last": 6.226298, "best": 6.226298, "count": 10}
    assert snap.metrics["learning_rate"]["last"] == 4.113475e-05
    assert len(snap.loss_history) == 10 and snap.loss_history[0] == 18.6387


def test_hf_eval_dicts_stay_out_of_the_loss_sparkline() -> None:
    snap = parse(read("hf_trainer_eval.log"))
    assert snap.loss_history == (2.3911, 2.2272)
    assert snap.metrics["eval_loss"] == {"last": 2.098778247833252, "best": 2.098778247833252, "count": 2}
    eval_only = parse(read("hf_eval_metrics.log"))
    assert eval_only.loss_history == ()
    assert eval_only.metrics["mrpc_en_eval_accuracy"]["count"] == 2
    assert "mrpc_en_eval_f1" in eval_only.metrics


def test_hf_eval_accuracy_best_is_max() -> None:
    lines = [
        "{'eval_loss': 0.52, 'eval_accuracy': 0.81, 'eval_runtime': 3.1, 'epoch': 1.0}",
        "{'eval_loss': 0.41, 'eval_accuracy': 0.88, 'eval_runtime': 3.0, 'epoch': 2.0}",
        "{'eval_loss': 0.45, 'eval_accuracy': 0.86, 'eval_runtime': 3.2, 'epoch': 3.0}",
    ]
    snap = parse("\n".join(lines).encode() + b"\n")
    assert snap.metrics["eval_accuracy"] == {"last": 0.86, "best": 0.88, "count": 3}
    assert snap.metrics["eval_loss"] == {"last": 0.45, "best": 0.41, "count": 3}
    assert snap.epoch == 3


def test_json_lines() -> None:
    data = b'{"epoch": 1, "num_epochs": 4, "loss": 0.9, "val_acc": 0.7}\n{"epoch": 2, "loss": 0.3, "val_acc": 0.91}\n'
    snap = parse(data)
    assert (snap.epoch, snap.total_epochs) == (2, 4)
    assert snap.progress == 0.5
    assert snap.metrics["loss"] == {"last": 0.3, "best": 0.3, "count": 2}
    assert snap.metrics["val_acc"] == {"last": 0.91, "best": 0.91, "count": 2}


def test_metric_best_and_last() -> None:
    log = b"loss: 0.5\nloss=0.3\nLoss 0.4\nacc: 97.5%\nacc: 98.1%\nacc: 96.0%\nval_loss=0.2\n"
    m = parse(log).metrics
    assert m["loss"] == {"last": 0.4, "best": 0.3, "count": 3}
    assert m["acc"] == {
        "last": pytest.approx(0.96),
        "best": pytest.approx(0.981),
        "count": 3,
    }  # percent: a fraction
    assert m["val_loss"]["count"] == 1


# ---- failure classes seen on real logs (issue 12) ----------------------------------------------


def test_split_words_name_the_metric_and_the_train_loss_stays_the_loss() -> None:
    snap = parse(read("lm_batches.log"))
    m = snap.metrics
    assert m["loss"]["count"] == 9 and m["loss"]["last"] == 3.95  # "valid loss" is not the loss
    assert m["valid_loss"] == {"last": 4.35, "best": 4.35, "count": 2}
    assert m["valid_ppl"]["best"] == 77.44
    assert len(snap.loss_history) == 9
    line = parse(b"epoch 3: train loss 1.54, val loss 1.72, train acc 0.73, val acc 74.87%\n").metrics
    assert line["train_loss"]["last"] == 1.54 and line["val_loss"]["last"] == 1.72
    assert line["train_acc"]["last"] == 0.73 and line["val_acc"]["last"] == pytest.approx(0.7487)
    keras = parse(read("device_side_assert.log")).metrics
    assert set(keras) == {"train_loss", "acc"}


def test_batches_inside_an_epoch_are_not_finished_epochs() -> None:
    namespace = b"Namespace(batch_size=20, bptt=35, clip=0.25, data='./data/wikitext-2', epochs=40, lr=20, seed=1111)\n"
    snap = parse(namespace + read("lm_batches.log"))
    assert (snap.epoch, snap.total_epochs) == (27, 40)
    assert snap.progress == pytest.approx((26 + 400 / 1106) / 40)  # not 27/40
    assert snap.metrics["lr"]["count"] == 9  # the Namespace's lr=20 is a setting, not a metric
    assert "seed" not in snap.metrics and "clip" not in snap.metrics
    batch = parse(b"Epoch   1 Batch  100/225 - Loss: 2.7359 - perplextity: 15.4241\n")
    assert (batch.epoch, batch.step, batch.total_steps) == (1, 100, 225)


def test_yolo_epoch_table_is_the_run_and_its_validation_bar_is_not() -> None:
    snap = parse(read("yolov8_epochs.log"))
    assert (snap.epoch, snap.total_epochs) == (46, 1000)
    assert snap.progress == pytest.approx(46 / 1000)  # not the per-epoch bar's 100%
    assert snap.eta_s and snap.eta_s > 900 * 5  # ~954 epochs of ~5 s to go, not 0
    m = snap.metrics
    assert m["box_loss"] == {"last": 1.14, "best": 1.14, "count": 3}
    assert m["box_map50-95"] == {"last": 0.574, "best": 0.673, "count": 3}
    assert "gpu_mem" not in m and "instances" not in m and "size" not in m
    assert snap.loss_history == (1.145, 1.153, 1.14)
    redraws = b"".join(
        b"\r    45/1000      6.73G      1.153     0.5309      1.113          5        640:  %d%%|##   | %d/16 [00:0%d<00:05,  2.79it/s]"
        % (n * 100 // 16, n, n % 10)
        for n in range(1, 9)
    )
    mid = parse(
        read("yolov8_epochs.log").split(b"\n\n")[0]
        + b"\n\n      Epoch    GPU_mem   box_loss   cls_loss   dfl_loss  Instances       Size\n"
        + redraws
    )
    assert mid.epoch == 45 and mid.progress == pytest.approx((44 + 8 / 16) / 1000)
    assert mid.metrics["box_loss"]["count"] == 2  # the row is read once per change, not per redraw


def test_an_evaluation_loop_does_not_replace_the_training_eta() -> None:
    train = parse(read("mmengine_epochs.log"))
    both = parse(read("mmengine_epochs.log") + read("mmengine_val.log"))
    assert both.eta_s == train.eta_s == 9.0  # not the val loop's "eta: 0:05:38"
    assert both.progress == train.progress


def test_nanogpt_iters_and_eval_steps() -> None:
    snap = parse(read("nanogpt_iters.log"))
    m = snap.metrics
    assert m["loss"] == {"last": 1.6524, "best": 1.6524, "count": 6}  # the iter loss, not the eval's
    assert m["train_loss"]["last"] == 1.544 and m["val_loss"]["last"] == 1.722
    assert snap.loss_history[-1] == 1.6524 and "mfu" not in m
    assert (
        "acc_iter" not in parse(read("openpcdet_timm_style.log")).metrics
    )  # "Acc_iter 150" counts iterations


def test_keras_evaluate_after_fit_is_not_training() -> None:
    data = read("keras_evaluate.log")
    snap = parse(data)
    assert (snap.progress, snap.eta_s, snap.epoch) == (1.0, 0.0, 100)
    assert snap.metrics["loss"]["count"] == 2 and snap.loss_history == (0.0266, 0.0266)
    assert snap.metrics["eval_loss"]["last"] == 0.0267 and snap.metrics["eval_accuracy"]["last"] == 0.9983
    mid = parse(data.rsplit(b"\n", 2)[0] + b"\n1200/2671 [=====>........] - ETA: 0s - loss: 0.0300\n")
    assert (mid.progress, mid.step, mid.total_steps) == (1.0, 4451, 4451)  # the evaluation bar is not the run


def test_keras_loss_printed_after_evaluate_is_not_the_training_loss() -> None:
    """fit() prints ``loss``; after evaluate() the script prints ``Loss: ...``: the evaluation's (keras 3 bars)."""
    snap = parse(read("keras3_evaluate_print.log"))
    assert (snap.progress, snap.epoch, snap.total_epochs, snap.phase) == (1.0, 10, 10, "eval")
    assert snap.metrics["loss"] == {"last": 0.1345, "best": 0.1345, "count": 3}
    assert snap.loss_history == (0.1606, 0.147, 0.1345)
    assert snap.metrics["eval_loss"]["last"] == pytest.approx(
        0.4551878
    )  # the printed one, after the bar's 0.4580
    assert snap.metrics["eval_accuracy"]["last"] == pytest.approx(0.85048)
    assert snap.metrics["eval_binary_accuracy"]["last"] == 0.8505 and snap.metrics["val_loss"]["count"] == 3
    training = parse(read("keras3_evaluate_print.log").split(b"782/782")[0] + b"Loss: 0.2\n")
    assert training.metrics["loss"]["last"] == 0.2  # no evaluation ran: a printed Loss is the training loss


def test_fairseq_and_deepspeed_lines() -> None:
    fairseq = parse(read("fairseq_epochs.log"))
    assert (fairseq.epoch, fairseq.step, fairseq.total_steps) == (10, 1000, 2737)  # inside epoch 10, not done
    assert fairseq.metrics["loss"]["count"] == 5 and fairseq.metrics["valid_loss"]["last"] == 6.37204
    ds = parse(read("deepspeed_steps.log"))
    assert (ds.step, ds.total_steps, ds.rate) == (
        1999,
        24128,
        "3.33s/it",
    )  # the bar with a log line glued to it
    assert ds.metrics["loss"]["count"] == 5 and "mom" not in ds.metrics and "skipped" not in ds.metrics


def test_an_evaluation_loop_shows_as_a_phase_not_as_progress() -> None:
    train = b"Epoch 2/5:  40%|####      | 40/100 [00:10<00:15,  4.00it/s, loss=0.3]\n"
    val = b"Validation DataLoader 0:  50%|#####     | 5/10 [00:01<00:01,  5.00it/s]\r"
    during = parse(train + val)
    assert during.phase == "eval" and during.progress == pytest.approx((1 + 0.4) / 5)
    after = parse(train + val + train.replace(b"40", b"41"))
    assert after.phase == "train"
    assert parse(read("keras_evaluate.log")).phase == "eval"
    assert parse(read("mmengine_epochs.log") + read("mmengine_val.log")).phase == "eval"
    assert parse(read("yolov8_epochs.log")).phase == "eval"  # the validation bar after each epoch's bar
    assert parse(read("lm_batches.log")).phase == "train"
    assert parse(b"hello\n").phase is None and parse(b"hello\n").to_json()["phase"] is None


def test_a_time_metric_has_no_best() -> None:
    m = parse(b"epoch 1 time: 127.3s\nepoch 2 time: 130.1s\ntotal time: 9000s\n").metrics
    assert m["time"]["best"] == m["time"]["last"] == 130.1
    assert m["total_time"]["last"] == 9000


def test_config_prints_are_not_metrics() -> None:
    snap = parse(read("cuda_init_warning.log"))
    assert "batch_size" not in snap.metrics and "lr_warmup_steps" not in snap.metrics
    assert snap.total_epochs == 10


def test_nan_loss_hint_and_json() -> None:
    snap = parse(b"step 10/100 loss=0.7\nstep 20/100 loss=nan\n")
    assert codes(snap) == ["loss_nan"]
    doc = json.loads(json.dumps(snap.to_json()))
    assert doc["loss_history"] == [0.7, None]
    assert doc["metrics"]["loss"]["best"] == 0.7
    assert doc["progress"] == 0.2


def test_bounded_metrics_and_history() -> None:
    many = "".join(f"m{i}_loss={i}\n" for i in range(MAX_METRICS + 10)).encode()
    assert len(parse(many).metrics) == MAX_METRICS
    losses = "".join(f"loss={i}\n" for i in range(LOSS_HISTORY * 3)).encode()
    snap = parse(losses)
    assert len(snap.loss_history) == LOSS_HISTORY
    assert snap.loss_history[-1] == LOSS_HISTORY * 3 - 1
    assert snap.metrics["loss"]["count"] == LOSS_HISTORY * 3


def test_snapshot_is_frozen_and_json_able() -> None:
    snap = parse(read("lightning_progress.log") + read("nccl_error.log"))
    with pytest.raises(AttributeError):
        snap.progress = 1.0  # type: ignore[misc]
    doc = json.loads(json.dumps(snap.to_json()))
    assert doc["hints"][0]["code"] == "nccl_error"
    assert doc["step"] == 5 and doc["rate"] == "4.14s/it"
    assert isinstance(snap.hints[0], Hint)


def test_snapshot_is_cached_until_the_next_feed() -> None:
    ins = LogInsights(clock=lambda: 0.0)
    ins.feed(MNIST_LINE)
    first = ins.snapshot()
    assert ins.snapshot() is first
    ins.feed(b"partial line without end")
    second = ins.snapshot()
    assert second == first and ins.snapshot() is second
    ins.feed(b"\n")
    assert ins.snapshot().last_line == "partial line without end"


# ---- chunking, encoding, bounds ----------------------------------------------------------------


def all_fixtures() -> bytes:
    return b"".join(read(p.name) for p in sorted(LOGS.glob("*.log"))) + mnist_run()


@pytest.mark.parametrize("name", sorted(HINT_FIXTURES) + CLEAN_FIXTURES)
def test_byte_by_byte_equals_one_shot(name: str) -> None:
    data = read(name).replace(b"\n", b"\r\n") if name.startswith("lightning") else read(name)
    assert parse(data, chunk=1).to_json() == parse(data).to_json()


def test_random_chunking_equals_one_shot() -> None:
    data = all_fixtures()
    whole = parse(data).to_json()
    rnd = random.Random(7)
    for _ in range(5):
        ins = LogInsights(clock=lambda: 0.0)
        i = 0
        while i < len(data):
            n = rnd.randint(1, 300)
            ins.feed(data[i : i + n])
            i += n
        assert ins.snapshot().to_json() == whole


def test_utf8_split_across_chunks_and_invalid_bytes() -> None:
    bar = " 45%|████▌     | 450/1000 [00:12<00:15, 36.1it/s]\n".encode()
    cut = bar.index("█".encode()) + 1  # inside the 3-byte sequence
    ins = LogInsights(clock=lambda: 0.0)
    ins.feed(b"\xff\xfe\x80 garbage \xc3(\n")
    ins.feed(bar[:cut])
    ins.feed(bar[cut:])
    ins.feed(b"\xf0\x9f loss=0.25 \xe2\x82\n")
    snap = ins.snapshot()
    assert snap.progress == 0.45
    assert snap.metrics["loss"]["last"] == 0.25
    assert "\ufffd" in snap.last_line
    json.dumps(snap.to_json())


def test_ten_megabyte_line_is_bounded() -> None:
    """Its memory stays bounded and the bar after it is read (its time: bench/insights.py --hostile)."""
    junk = b"0123456789 loss=1 [00:01<00:02, " * (10 * 1024 * 1024 // 32)
    tail = " 50%|█████     | 5/10 [00:01<00:01,  5.0it/s]\n".encode()
    for chunk in (None, 64 * 1024):
        tracemalloc.start()
        ins = LogInsights(clock=lambda: 0.0)
        if chunk is None:
            ins.feed(junk)
        else:
            for i in range(0, len(junk), chunk):
                ins.feed(junk[i : i + chunk])
        kept, _peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert len(ins._partial) <= 2 * MAX_LINE
        assert kept < 256 * 1024  # only a bounded tail of the unfinished line stays
        ins.feed(tail)
        snap = ins.snapshot()
        assert len(snap.last_line) <= MAX_LINE
        assert snap.progress == 0.5  # the bar glued to the huge line's tail is still read


def test_many_short_lines_do_not_blow_up() -> None:
    """200,000 bare redraws, then a summary line: it is read (their time: bench/insights.py --hostile)."""
    data = b"x\r" * 200_000 + MNIST_LINE
    snap = parse(data, chunk=65536)
    assert snap.epoch == 2 and snap.metrics["test_acc"]["last"] == 0.9812


# ---- hints from telemetry and exit codes -------------------------------------------------------


def test_low_gpu_util_hint() -> None:
    low = [5.0, 12.0, 8.0, 20.0] * 5
    (hint,) = hints_from_metrics(True, low, [])
    assert hint.code == "low_gpu_util" and "num_workers" in hint.fix and "pin_memory" in hint.fix
    assert hints_from_metrics(False, low, []) == []  # job not running
    assert hints_from_metrics(True, low[:5], []) == []  # too few samples
    assert hints_from_metrics(True, [95.0] * 20 + [0.0] * 5, []) == []  # median is high
    assert "CPU core" not in hint.line
    procs = [{"pid": 1, "job": "7", "cpu_percent": 99.6}, {"pid": 2, "job": "8", "cpu_percent": 100.0}]
    (starved,) = hints_from_metrics(True, low, [{"index": 0, "processes": procs}], job="7")
    assert starved.line.endswith("; the job's process at 100% of a CPU core")
    procs[0]["children"] = 0  # the agent saw it start no process: the data is loaded in the main process
    (alone,) = hints_from_metrics(True, low, [{"index": 0, "processes": procs}], job="7")
    assert alone.line.endswith("; the job's process at 100% of a CPU core, with no worker processes")
    procs[0].update(cpu_percent=35.0, children=4, children_cpu_percent=395.0)  # 4 DataLoader workers, all busy
    (workers,) = hints_from_metrics(True, low, [{"index": 0, "processes": procs}], job="7")
    assert workers.line.endswith("; its 4 worker processes at 395% of a core together")
    procs[0].update(children_cpu_percent=20.0)  # the other job's busy process is not this job's bottleneck
    (fed,) = hints_from_metrics(True, low, [{"index": 0, "processes": procs}], job="7")
    assert "CPU core" not in fed.line and "worker" not in fed.line


def test_throttle_hints() -> None:
    gpus = [
        {"index": 0, "name": "NVIDIA H100", "temp_c": 88.0, "throttle_reasons": []},
        {"index": 1, "name": "NVIDIA H100", "temp_c": 60.0, "throttle_reasons": ["sw_power_cap"]},
        {"index": 2, "name": "NVIDIA H100", "temp_c": 70.0, "throttle_reasons": ["hw_slowdown"]},
    ]
    hints = {h.code: h for h in hints_from_metrics(True, [], gpus)}
    assert set(hints) == {"gpu_thermal_throttle", "gpu_power_cap"}
    assert "GPU 0" in hints["gpu_thermal_throttle"].line and "GPU 2" in hints["gpu_thermal_throttle"].line
    assert "GPU 1" in hints["gpu_power_cap"].line
    cool = [{"index": 0, "temp_c": 60.0, "throttle_reasons": ["gpu_idle"]}]
    assert hints_from_metrics(True, [], cool) == []


def test_oom_names_other_processes_holding_memory() -> None:
    gpus = [
        {
            "index": 0,
            "name": "NVIDIA A100",
            "processes": [
                {"pid": 4242, "mem_mib": 30720.0, "job": None, "name": "python3"},
                {"pid": 5151, "mem_mib": 2048.0, "job": "j-other", "name": "python"},
                {"pid": 6161, "mem_mib": 9000.0, "job": "j-me", "name": "python"},
            ],
        }
    ]
    (hint,) = hints_from_metrics(True, [], gpus, job="j-me", oom=True)
    assert hint.code == "gpu_memory_others"
    assert "pid 4242" in hint.fix and "pid 5151" in hint.fix and "job j-other" in hint.fix
    assert "6161" not in hint.fix
    assert hints_from_metrics(True, [], gpus, job="j-me") == []  # only after an OOM


def test_metrics_hints_accept_sample_objects() -> None:
    from gputui.core.session import model as M

    gpu = M.GpuSample(index=3, name="L4", temp_c=90.0, throttle_reasons=())
    assert [h.code for h in hints_from_metrics(True, [], [gpu])] == ["gpu_thermal_throttle"]


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (137, "exit_sigkill"),
        (-9, "exit_sigkill"),
        (139, "exit_segfault"),
        (134, "exit_abort"),
        (0, None),
        (1, None),
    ],
)
def test_hint_for_exit(code: int, expected: str | None) -> None:
    hint = hint_for_exit(code)
    assert (hint.code if hint else None) == expected
    if hint:
        assert str(code) in hint.line and hint.fix


def test_hint_for_exit_none() -> None:
    assert hint_for_exit(None) is None


def test_hint_line_is_capped() -> None:
    snap = parse(b"RuntimeError: CUDA out of memory. " + b"x" * 3000 + b"\n")
    assert len(snap.hints[0].line) == 300 and snap.hints[0].line.endswith("…")
    # a longer line keeps its tail only (MAX_LINE bytes), before any regex sees it
    snap = parse(b"y" * 10_000 + b" RuntimeError: CUDA out of memory.\n")
    assert codes(snap) == ["cuda_oom"]
    assert len(snap.last_line) == MAX_LINE


def test_job_hints_join_log_exit_and_gpu_telemetry() -> None:
    from gputui.core.insights import job_hints
    from gputui.core.session import model as M
    from gputui.core.session.metrics_history import MetricsHistory

    idle = M.GpuSample(index=0, util_percent=5.0, processes=(M.GpuProcess(pid=9, mem_mib=900, job="j1"),))
    busy = M.GpuSample(index=1, util_percent=99.0, processes=(M.GpuProcess(pid=7, mem_mib=500),))
    samples = tuple(M.MetricsSample(seq=i, t=i, host=M.HostStats(), gpus=(idle, busy)) for i in range(12))
    host = M.HostSnapshot(name="h", metrics=samples[-1], history=MetricsHistory.of(samples))
    running = M.Job(host="h", id="j1", name="j1", state=M.JOB_RUNNING, command=("python",))
    assert [h.code for h in job_hints(running, parse(read("cuda_oom_legacy.log")), host)] == [
        "cuda_oom",
        "low_gpu_util",  # GPU 0 only: GPU 1 at 99% does not run this job
    ]
    ended = M.Job(host="h", id="j2", name="j2", state=M.JOB_FAILED, command=("python",), exit_code=139)
    assert [h.code for h in job_hints(ended, None, host)] == ["exit_segfault"]
    assert job_hints(None, None, host) == []


def test_no_rule_fires_on_any_line_of_a_clean_log() -> None:
    from gputui.core.insights.log_hints import add_line_hints

    for name in [*CLEAN_FIXTURES, "lm_batches.log", "yolov8_epochs.log"]:
        for line in read(name).decode("utf-8", "replace").replace("\r", "\n").splitlines():
            found: dict[str, Hint] = {}
            add_line_hints(line, found)
            assert not found, (name, line)


def test_a_dict_epoch_that_is_not_finite_is_ignored() -> None:
    """{'epoch': nan} or inf in a JSON/dict line (a diverged or odd logger) is no epoch, not a traceback."""
    ins = LogInsights(clock=lambda: 0.0)
    ins.feed(b"{'loss': 0.5, 'epoch': nan}\n{'loss': 0.4, 'epoch': inf}\n{\"epoch\": -inf}\n")
    snap = ins.snapshot()
    assert snap.epoch is None and snap.metrics["loss"]["last"] == 0.4


def test_a_training_metric_after_an_evaluation_bar_keeps_its_name() -> None:
    """After a validation bar, a bare "loss" is the evaluation's, but "train_loss" is still the training's."""
    snap = parse(read("tqdm_recorded.log"))
    assert snap.phase == "eval" and snap.metrics["train_loss"]["last"] == 0.1539
    assert "eval_train_loss" not in snap.metrics and snap.metrics["val_loss"]["last"] == 0.1692
    assert parse(read("tqdm_recorded.log") + b"loss 0.5\n").metrics["eval_loss"]["last"] == 0.5


def test_lightning_rich_progress_bar() -> None:
    """Lightning's RichProgressBar counts epochs from 0 and names the last one ("Epoch 3/9" is the 4th of 10); its
    count, times and speed come after the bar ("500/938 0:00:11 • 0:00:10 43.17it/s"), its metrics after them."""
    data = read("lightning_rich.log")
    done = parse(data)
    assert (done.progress, done.eta_s, done.epoch, done.total_epochs) == (1.0, 0.0, 24, 24)  # counted from 1
    assert done.rate == "4.37it/s" and not done.hints
    assert done.metrics["train/loss"] == {"last": 0.212, "best": 0.185, "count": 6}
    assert done.metrics["val/acc"]["last"] == 0.918 and done.loss_history[-3:] == (0.242, 0.185, 0.212)
    third = parse(data[: data.index(b"Epoch 21")])  # 3 of 24 epochs done, each 23 s
    assert (third.progress, third.eta_s, third.epoch) == (3 / 24, 21 * 23.0, 3)
    bar = (
        "Epoch 3/9  ━━━━━━━━━━━━━━━━━━╸━━━━━━━━━━━━ 500/938 0:00:11 • 0:00:10 43.17it/s v_num: 0 loss: 0.06\n"
    )
    mid = parse(bar.encode())
    assert (mid.progress, mid.eta_s) == ((3 + 500 / 938) / 10, 10 + 6 * 21.0)
    assert (mid.step, mid.total_steps) == (500, 938)
    val = parse((bar + "Validation ━━━━━━━━━━━━━━ 7/63 0:00:01 • 0:00:08 6.90it/s\n").encode())
    assert (val.phase, val.progress, val.step) == ("eval", mid.progress, 500)  # still the training run's
    day = "Epoch 2/99 ━━━━━━━━━━━━ 100/938 1 day, 2:03:04 • 0:10:00 0.57it/s v_num: 0 loss: 1.5\n"
    assert parse(day.encode()).eta_s == 600 + 97 * (26 * 3600 + 3 * 60 + 4 + 600)
    endless = parse(
        "Epoch 0/-2 ━━━━━━━━━━━━━ 5072/-- 2:40:43 • -:--:-- 0.57it/s v_num: x loss: 10.4\n".encode()
    )
    assert (endless.step, endless.total_steps, endless.total_epochs, endless.eta_s) == (
        5072,
        None,
        None,
        None,
    )


def test_metrics_in_a_bars_description_are_read_once_a_change() -> None:
    """Training loops often name their loss in the bar's description (set_description) rather than its postfix;
    torchtune writes "{epoch}|{step}|Loss: {loss}" there."""
    bar = "Epoch 3 loss %s:  45%%|████▌     | %d/1000 [00:12<00:15, 36.1it/s]\r"
    snap = parse(
        "".join(bar % (loss, n) for loss, n in [("0.1234", 450), ("0.1234", 451), ("0.1100", 452)]).encode()
    )
    assert snap.metrics["loss"] == {"last": 0.11, "best": 0.11, "count": 2} and snap.epoch == 3
    tune = parse(read("torchtune_lora.log"))
    assert tune.metrics["loss"]["last"] == 2.3697006702423096 and (tune.epoch, tune.step) == (1, 52)
    assert (tune.progress, tune.eta_s, tune.total_steps) == (52 / 25880, 3 * 3600 + 55 * 60 + 1.0, 25880)
    files = parse("Processing 3 files:  45%|████▌     | 450/1000 [00:12<00:15, 36.1it/s]\n".encode())
    assert files.metrics == {} and files.progress == 0.45


def test_megatron_iterations() -> None:
    """Megatron-LM names its metrics in two words ("lm loss", "grad norm", "learning rate") and gives the time per
    iteration, which with the iterations left is its ETA."""
    snap = parse(read("megatron_iterations.log"))
    assert (snap.step, snap.total_steps, snap.progress) == (125, 250000, 125 / 250000)
    assert snap.eta_s == pytest.approx((250000 - 125) * 89.0752)
    assert snap.metrics["lm_loss"] == {"last": 2.477393, "best": 2.477393, "count": 4}
    assert snap.metrics["grad_norm"]["last"] == 0.356 and snap.metrics["learning_rate"]["last"] == 9.375e-06
    assert snap.loss_history == (2.50422, 2.493043, 2.559583, 2.477393)
