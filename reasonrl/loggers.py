"""The backends of ``run.loggers`` that :class:`~reasonrl.metrics.MetricsSink` fans each row out to.

    tensorboard   RUN_DIR/tensorboard: scalars, the config (text and hparams), text samples
    wandb         Weights & Biases (the optional ``wandb`` package): config, metrics, a sample table

Each backend owns its writer or run and implements the :class:`~reasonrl.metrics.Logger`
protocol: ``rewind`` (a resume will log the steps after the checkpoint again),
``log_metrics``, ``log_samples`` and ``close``.

A resumed W&B run stays one run: its id is kept in ``RUN_DIR/wandb/run_id`` and the resume
continues it (``resume="allow"``). W&B refuses steps that go back, so the steps a resume
redoes (those after the checkpoint that were logged before the crash) are not sent to it
again: W&B keeps their first values, while metrics.jsonl and TensorBoard hold the redone ones.
"""

from __future__ import annotations

import os
import threading
import uuid
from pathlib import Path
from typing import Any, Callable, Sequence

import yaml

from reasonrl.config import Config, flatten, to_dict
from reasonrl.errors import InputError, WriteError
from reasonrl.metrics import Logger, Sample, write_atomic

HPARAM_METRICS = ("critic/score/mean", "train/acc", "val/acc")
"""The scalars TensorBoard's HPARAMS dashboard shows beside the hyperparameters."""

SAMPLE_COLUMNS = ["step", "prompt", "response", "reward", "acc"]
"""The columns of the W&B sample table (``reward`` is the sample's score)."""


def import_wandb():
    """The ``wandb`` module; an InputError naming run.loggers and the extra when it is missing."""
    try:
        import wandb
    except ImportError as err:
        raise InputError(f"run.loggers: 'wandb' needs the wandb package, which cannot be imported ({err}); "
                         "install it with pip install 'reasonrl[wandb]', or drop wandb from run.loggers") from None
    return wandb


def check_loggers(names: Sequence[str]) -> None:
    """Raise now (InputError), before a run is built, if a chosen logger's package is missing."""
    if "wandb" in names:
        import_wandb()


def open_loggers(cfg: Config, run_dir: str | Path) -> list[Logger]:
    """The backends ``cfg.run.loggers`` names, each given the resolved config; the W&B mode is
    ``run.wandb_mode`` unless the WANDB_MODE environment variable says otherwise."""
    run_dir, config, r = Path(run_dir), to_dict(cfg), cfg.run
    loggers: list[Logger] = []
    if "tensorboard" in r.loggers:
        loggers.append(TensorBoardLogger(run_dir / "tensorboard", config))
    if "wandb" in r.loggers:
        mode = os.environ.get("WANDB_MODE") or r.wandb_mode
        loggers.append(WandbLogger(run_dir, config, project=r.wandb_project, mode=mode))
    return loggers


def samples_markdown(samples: Sequence[Sample]) -> str:
    """The samples as a markdown table (prompt, response, reward, acc) for TensorBoard's text tab."""

    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", "<br>")

    rows = [f"| {cell(s.prompt)} | {cell(s.response)} | {s.score:.3f} | {'yes' if s.acc else 'no'} |" for s in samples]
    return "\n".join(["| prompt | response | reward | acc |", "|---|---|---|---|", *rows])


_previous_hook = threading.excepthook


def _quiet_writer_thread(args) -> None:
    """TensorBoard's writer thread ends on a failed write (a full disk) and its writer raises
    the error again in the thread that logs, where :class:`TensorBoardLogger` reports it as a
    WriteError: that thread's own traceback is left out; any other goes to the hook before."""
    if isinstance(args.exc_value, OSError) and type(args.thread).__name__ == "_AsyncWriterThread":
        return
    _previous_hook(args)


def _quiet_tensorboard_threads() -> None:
    global _previous_hook
    if threading.excepthook is not _quiet_writer_thread:
        _previous_hook, threading.excepthook = threading.excepthook, _quiet_writer_thread


class TensorBoardLogger:
    """Scalars, the config and text samples in ``log_dir`` (opened at the first row).

    When the writer opens, the config goes in as text (``config``, the YAML in a code block)
    and as hparams (its scalar leaves under dotted keys), at the step the run starts from.
    After ``rewind(step, ...)`` the events past ``step`` are purged (``purge_step``). A write
    that fails (a full disk) is a WriteError naming ``log_dir``; the writer is dropped then.
    """

    def __init__(self, log_dir: str | Path, config: dict[str, Any]) -> None:
        self.log_dir = Path(log_dir)
        self.config = config
        self._writer = None
        self._purge_step: int | None = None

    def rewind(self, step: int, last_logged: int) -> None:
        """Purge the events past ``step`` when the writer opens again."""
        self.close()
        self._purge_step = step + 1

    def log_metrics(self, step: int, values: dict[str, int | float]) -> None:
        def write(writer) -> None:
            for key, value in values.items():
                writer.add_scalar(key, value, global_step=step)

        self._write(write)

    def log_samples(self, step: int, samples: Sequence[Sample], tag: str = "samples") -> None:
        """The samples as one markdown table under the text tag ``tag``."""
        self._write(lambda writer: writer.add_text(tag, samples_markdown(samples), global_step=step))

    def close(self) -> None:
        if self._writer is not None:
            writer, self._writer = self._writer, None
            try:
                writer.close()
            except OSError as err:
                raise WriteError.of(self.log_dir, err) from err

    def _write(self, write: Callable[[Any], None]) -> None:
        """``write(writer)`` and flush; a failure drops the writer and is a WriteError."""
        try:
            writer = self._open()
            write(writer)
            writer.flush()
        except OSError as err:
            writer, self._writer = self._writer, None
            if writer is not None:
                try:
                    writer.close()
                except OSError:
                    pass  # it fails as the write did
            raise WriteError.of(self.log_dir, err) from err

    def _open(self):
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            _quiet_tensorboard_threads()
            start = self._purge_step or 0
            self._writer = SummaryWriter(log_dir=str(self.log_dir), purge_step=self._purge_step)
            self._purge_step = None
            self._write_config(start)
        return self._writer

    def _write_config(self, step: int) -> None:
        from torch.utils.tensorboard.summary import hparams

        text = yaml.safe_dump(self.config, sort_keys=False, allow_unicode=True)
        self._writer.add_text("config", "```yaml\n" + text + "```", global_step=step)
        scalars = {k: v for k, v in flatten(self.config).items() if isinstance(v, (bool, int, float, str))}
        for summary in hparams(scalars, dict.fromkeys(HPARAM_METRICS, 0.0)):
            self._writer.file_writer.add_summary(summary, step)


class WandbLogger:
    """One W&B run per run directory: created (or continued, after a resume) at construction.

    The run is named after the run directory and writes under it (``RUN_DIR/wandb``); its id
    is kept in ``RUN_DIR/wandb/run_id`` so a resumed run continues it. Steps up to the last
    one logged before a resume are skipped (W&B refuses steps that go back).
    """

    def __init__(self, run_dir: str | Path, config: dict[str, Any], project: str, mode: str) -> None:
        wandb = import_wandb()
        self._table = wandb.Table
        run_dir = Path(run_dir).resolve()
        id_file = run_dir / "wandb" / "run_id"
        self.resumed = id_file.is_file()
        if self.resumed:
            run_id = id_file.read_text(encoding="utf-8").strip()
        else:
            run_id = uuid.uuid4().hex[:8]
            id_file.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(id_file, run_id + "\n")
        try:
            self.run = wandb.init(project=project, name=run_dir.name, dir=str(run_dir), id=run_id, resume="allow",
                                  mode=mode, config=config, reinit="create_new")
        except (wandb.errors.UsageError, wandb.errors.AuthenticationError) as err:  # no login: no restart helps
            raise InputError(f"run.loggers: wandb.init failed in {mode} mode ({err}); log in with `wandb login` (or "
                             "set WANDB_API_KEY), or use run.wandb_mode=offline") from None
        self._skip_through = self.run.step - 1
        """Steps up to this one are in the W&B run already (a resume redoes them)."""

    def rewind(self, step: int, last_logged: int) -> None:
        """Skip the steps up to ``last_logged`` when continuing a run that holds them."""
        if self.resumed:
            self._skip_through = max(self._skip_through, last_logged)

    def log_metrics(self, step: int, values: dict[str, int | float]) -> None:
        if step > self._skip_through:
            self.run.log(values, step=step)

    def log_samples(self, step: int, samples: Sequence[Sample], tag: str = "samples") -> None:
        """The samples as a table ``tag`` (columns step, prompt, response, reward, acc)."""
        if step > self._skip_through:
            rows = [[step, s.prompt, s.response, s.score, s.acc] for s in samples]
            self.run.log({tag: self._table(columns=SAMPLE_COLUMNS, data=rows)}, step=step)

    def close(self) -> None:
        """Finish the run (closing twice is harmless)."""
        if self.run is not None:
            self.run.finish()
            self.run = None
