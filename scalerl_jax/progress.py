"""What a researcher sees in the terminal: log lines, a progress bar, the end-of-run summary.

`setup_logging` replaces the root's console handler (importing Orbax leaves absl's WARNING
handler there, which makes an entry point's `basicConfig(level=INFO)` a no-op) with one that
writes through `tqdm.write`, so bars and log lines share stderr. Off a terminal `Progress`
draws nothing and logs a plain line every N steps / M seconds (`SCALERL_PROGRESS=1/0`
overrides); `heartbeat.py` keeps a line coming at least every 30 s.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import logging
import math
import os
import sys
import time
from typing import Any, Optional, Sequence

from tqdm import tqdm

from scalerl_jax.heartbeat import HEARTBEAT

log = logging.getLogger(__name__)

ENV_PROGRESS = "SCALERL_PROGRESS"
NOISY_LOGGERS = ("absl", "orbax", "jax._src")
_PACKAGE = __name__.split(".")[0]


class _Formatter(logging.Formatter):
    """`HH:MM:SS name: message`, with our package prefix dropped from names (they are all ours)."""

    def __init__(self):
        super().__init__("%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")

    def format(self, record: logging.LogRecord) -> str:
        record = copy.copy(record)  # other handlers (files, caplog) format the same record
        record.name = record.name.removeprefix(_PACKAGE + ".")
        return super().format(record)


class _ConsoleHandler(logging.Handler):
    """Writes via `tqdm.write`. Without a stream, sys.stderr is looked up per record so later
    redirection (pytest capture, contextlib.redirect_stderr) is honoured."""

    def __init__(self, stream=None):
        super().__init__()
        self.stream = stream

    def emit(self, record: logging.LogRecord) -> None:
        try:
            stream = sys.stderr if self.stream is None else self.stream
            tqdm.write(self.format(record).rstrip("\n"), file=stream)
            stream.flush()
            HEARTBEAT.printed()
        except Exception:  # logging must never take the run down
            self.handleError(record)


def _is_console_handler(handler: logging.Handler) -> bool:
    if isinstance(handler, _ConsoleHandler) or type(handler).__name__ == "ABSLHandler":
        return True
    # Exactly what basicConfig() makes; subclasses (FileHandler, pytest's capture) are kept.
    return type(handler) is logging.StreamHandler and _fd(handler.stream) in (1, 2)


def _fd(stream) -> Optional[int]:
    try:
        return stream.fileno()
    except (OSError, ValueError, AttributeError):  # StringIO, closed or fd-less streams
        return None


def setup_logging(
    level: int | str = "INFO",
    *,
    loggers: Sequence[str] = (_PACKAGE, "__main__"),
    quiet: Sequence[str] = NOISY_LOGGERS,
    stream=None,
) -> logging.Handler:
    """Makes `loggers` print at `level` on stderr, whatever absl/orbax did first. Idempotent.

    Why the root logger, not a private handler on `scalerl_jax` with propagate off: warnings from
    JAX/Orbax must also go through tqdm.write (or they tear the bar), and pytest's caplog and any
    file handler a user adds on the root keep seeing our records. Rather than `force=True`, which
    would also drop such handlers, only console handlers (basicConfig's, absl's, ours) are
    replaced. The root stays at WARNING so third-party INFO chatter (httpx, matplotlib, ...)
    stays out; only `loggers` are lowered to `level`.
    """
    root = logging.getLogger()
    for handler in list(root.handlers):
        if _is_console_handler(handler):
            root.removeHandler(handler)
    handler = _ConsoleHandler(stream)
    handler.setFormatter(_Formatter())
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    for name in loggers:
        logging.getLogger(name).setLevel(level)
    for name in quiet:
        logging.getLogger(name).setLevel(logging.WARNING)
    logging.captureWarnings(True)  # warnings.warn would otherwise print straight through a bar
    return handler


@dataclasses.dataclass(frozen=True)
class Field:
    """One postfix entry: `label` shows metrics[`key`] formatted with `fmt`."""

    label: str
    key: str
    fmt: str = ".3g"


RL_FIELDS = (
    Field("loss", "loss", ".4f"),
    Field("reward", "reward_mean", ".3f"),
    Field("pass", "pass_rate_train", ".3f"),
    Field("stale", "staleness_max", ".0f"),
)
SFT_FIELDS = (Field("loss", "loss", ".4f"),)


def _auto_enabled(stream) -> bool:
    forced = os.environ.get(ENV_PROGRESS, "").strip().lower()
    if forced in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        return forced in ("1", "true", "yes", "on")
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def _zero_width(stream) -> bool:
    fd = _fd(stream)
    if fd is None:
        return False
    try:
        return os.get_terminal_size(fd).columns == 0
    except OSError:
        return False


def _fmt(value: Any, fmt: str, missing: str = "-") -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return format(value, fmt) if math.isfinite(value) else missing
    return missing if value is None else str(value)


def _si(value: float) -> str:
    div, suffix = next(
        ((d, x) for d, x in ((1e9, "G"), (1e6, "M"), (1e3, "k")) if value >= d), (1.0, "")
    )
    return f"{value / div:.{1 if suffix else 0}f}{suffix}"


class Progress:
    """A bar over steps `initial..total` on a terminal; periodic INFO lines elsewhere.

    `update(step, metrics)` after each step, with the step just finished and its metrics (a
    train record as is). Keyword extras (`forecast="A 0.61"`) stick until replaced; None drops
    one. `tokens_key` names the token count of the step just finished; tokens/s is its mean
    times steps/s, so it stays right when updates come every k steps (SFT logs every
    `log_every`). Rates cover the last `window` updates, so the first step's compile washes
    out. Off a terminal a line is logged at the first update, every `log_every_steps` steps or
    `log_every_s` seconds (either may be None), and at `close()`.
    """

    def __init__(
        self,
        desc: str,
        total: int,
        *,
        initial: int = 0,
        fields: Sequence[Field] = RL_FIELDS,
        tokens_key: Optional[str] = None,
        enabled: Optional[bool] = None,
        stream=None,
        unit: str = "step",
        log_every_steps: Optional[int] = None,
        log_every_s: Optional[float] = 60.0,
        window: int = 20,
    ):
        self.desc, self.total, self.fields, self.tokens_key = desc, int(total), fields, tokens_key
        self.unit, self.step = unit, int(initial)
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = _auto_enabled(self.stream) if enabled is None else bool(enabled)
        self.log_every_steps, self.log_every_s = log_every_steps, log_every_s
        self._values: dict[str, Any] = {}
        self._extra: dict[str, Any] = {}
        self._eval: Optional[tuple[int, Optional[float]]] = None
        self._forecast: Optional[str] = None
        now, self._tokens, self._updates = time.monotonic(), 0.0, 0
        self._marks = collections.deque([(now, self.step, 0.0, 0)], maxlen=window + 1)
        self._logged: tuple[float, Optional[int]] = (now, None)  # (time, step): last plain line
        self.bar = None
        if self.enabled:
            # A terminal reporting 0 columns (a fresh pty, some IDE consoles) would make tqdm
            # trim the bar to nothing: draw it 100 wide there instead.
            width = {"ncols": 100} if _zero_width(self.stream) else {"dynamic_ncols": True}
            self.bar = tqdm(
                total=self.total,
                initial=self.step,
                desc=desc,
                unit=unit,
                file=self.stream,
                mininterval=0.5,
                # tqdm's own rate and ETA would count the first update's compile: ours follow.
                bar_format="{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} "
                "[{elapsed}{postfix}]",
                **width,
            )

    def update(self, step: int, metrics: Optional[dict] = None, **extra: Any) -> None:
        metrics = metrics or {}
        self._values.update({f.label: metrics[f.key] for f in self.fields if f.key in metrics})
        self._extra.update(extra)
        self._extra = {k: v for k, v in self._extra.items() if v is not None}
        self._tokens += float(metrics.get(self.tokens_key) or 0.0) if self.tokens_key else 0.0
        self.step, now, self._updates = int(step), time.monotonic(), self._updates + 1
        if self._updates == 1:  # the time to the first update includes compiling: no rate
            self._marks.clear()
        self._marks.append((now, self.step, self._tokens, self._updates))
        if self.bar is not None:
            self.bar.set_postfix_str(self._bar_postfix(), refresh=False)
            self.bar.update(self.step - self.bar.n)
            HEARTBEAT.printed()  # the redrawn bar is news enough
        elif self._due(now):
            self._log_line(now)

    def set_eval(self, step: int, pass_rate: Optional[float]) -> None:
        self._eval = (int(step), pass_rate)
        if self.bar is not None:
            self.bar.set_postfix_str(self._bar_postfix())

    def set_forecast(self, record: dict) -> None:
        """Show a `forecast` record (scaling/forecast.py) after the validation pass rate; the
        first one comes with a line saying what the column means."""
        if self._forecast is None:
            self.note(forecast_legend(record))
        self._forecast = forecast_text(record)
        if self.bar is not None:
            self.bar.set_postfix_str(self._bar_postfix())

    def note(self, text: str) -> None:
        """A one-off line above the bar (a log line when there is no bar)."""
        if self.bar is not None:
            self.bar.write(text, file=self.stream)
        else:
            log.info("%s: %s", self.desc, text)

    def rates(self) -> tuple[Optional[float], Optional[float]]:
        """(tokens/s, s/step) over the window; None before there is anything to divide."""
        (t0, s0, tok0, n0), (t1, s1, tok1, n1) = self._marks[0], self._marks[-1]
        if s1 <= s0 or t1 <= t0:
            return None, None
        tokens_per_step = (tok1 - tok0) / (n1 - n0) if self.tokens_key else None
        seconds_per_step = (t1 - t0) / (s1 - s0)
        return (
            None if tokens_per_step is None else tokens_per_step / seconds_per_step,
            seconds_per_step,
        )

    def postfix(self) -> str:
        parts = [
            f"{f.label} {_fmt(self._values[f.label], f.fmt)}"
            for f in self.fields
            if f.label in self._values
        ]
        if self._eval is not None:
            parts.append(f"val {_fmt(self._eval[1], '.3f')}@{self._eval[0]}")
        if self._forecast is not None:
            parts.append(self._forecast)
        tokens_per_s = self.rates()[0]
        if tokens_per_s is not None:
            parts.append(f"tok/s {_si(tokens_per_s)}")
        parts.extend(f"{key} {_fmt(value, '.3g')}" for key, value in self._extra.items())
        return " | ".join(parts)

    def _due(self, now: float) -> bool:
        last_t, last_step = self._logged
        if last_step is None or self.step >= self.total:
            return True
        by_steps = self.log_every_steps and self.step - last_step >= self.log_every_steps
        by_time = self.log_every_s is not None and now - last_t >= self.log_every_s
        return bool(by_steps or by_time)

    def eta(self) -> Optional[str]:
        """'s/step | ETA h:mm:ss' from the rate after the first update (which compiled), or
        what is waited for; None when done."""
        spent = self.rates()[1]
        if spent is not None:
            eta = tqdm.format_interval(max(self.total - self.step, 0) * spent)
            return f"{spent:.3g} s/{self.unit} | ETA {eta}"
        return "ETA after the next update (this one compiled)" if self.step < self.total else None

    def _bar_postfix(self) -> str:
        return " | ".join(p for p in (self.postfix(), self.eta()) if p)

    def _log_line(self, now: float) -> None:
        pct = 100.0 * self.step / self.total if self.total else 100.0
        line = f"{self.desc} {self.step}/{self.total} ({pct:.0f}%)"
        rest = " | ".join(p for p in (self.postfix(), self.eta()) if p)
        log.info("%s", f"{line} | {rest}" if rest else line)
        self._logged = (now, self.step)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        elif self._logged[1] is not None and self._logged[1] != self.step:
            self._log_line(time.monotonic())

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def forecast_text(record: dict) -> str:
    """'A≈0.74±0.02 stable' (± half the interval's width; 'stable' once A settled), or
    'A≈ n/a' while the points do not support a fit."""
    A = record.get("A")
    if not record.get("ok") or not isinstance(A, (int, float)):
        return "A≈ n/a"
    text = f"A≈{A:.2f}"
    lo, hi = record.get("A_lo"), record.get("A_hi")
    if isinstance(lo, (int, float)) and isinstance(hi, (int, float)):
        text += f"±{(hi - lo) / 2:.2f}"
    return text + (" stable" if record.get("stable") else "")


def forecast_legend(record: dict) -> str:
    """What the `A≈` column is, and why it reads n/a when `record` has no fit."""
    text = (
        "A≈: the pass rate the sigmoid fitted to the evaluations so far levels off at "
        "(± half its 95% interval; 'stable' once it has settled)"
    )
    if forecast_text(record) == "A≈ n/a":
        why = record.get("reason") or "no fit yet"
        text += f"; n/a until the evaluations support a fit (now: {why})"
    return text


def _fit_line(label: str, fit: Optional[dict], reason: Optional[str], x_label: str) -> str:
    if fit is None:
        return f"{label}: none ({reason or 'not run'})"
    parts = []
    for name, fmt in (("A", ".3f"), ("B", ".3g"), ("C_mid", ".4g")):
        text = f"{name} {_fmt(fit.get(name), fmt, 'n/a')}"
        lo, hi = fit.get(f"{name}_lo"), fit.get(f"{name}_hi")
        if lo is not None and hi is not None:
            text += f" [{_fmt(lo, fmt, 'n/a')}, {_fmt(hi, fmt, 'n/a')}]"
        parts.append(text)
    return f"{label}: {'  '.join(parts)}  (C_mid in {x_label})"


def summary_lines(
    workdir: str,
    evals: Sequence[dict],
    fit: Optional[dict] = None,
    *,
    fit_reason: Optional[str] = None,
    x_label: str = "device-hours",
    domain_fits: Optional[dict] = None,
) -> list[str]:
    """The end-of-run summary, one string per line.

    evals: the run's eval records (e.g. `read_metrics(workdir).of("eval")`); the last record of
    each step counts, as in `eval_xy`. fit: {"A", "B", "C_mid"} with optional "<name>_lo" and
    "<name>_hi" interval ends, or None with `fit_reason` saying why there is no fit.
    domain_fits: a mixture's {domain: such a dict, or {"reason": why not}}
    (`report.domain_headlines`); each domain's pass rates come from the records' `per_domain`.
    """
    by_step = {int(e["step"]): e for e in evals}
    lines = []
    if by_step:
        first, last = by_step[min(by_step)], by_step[max(by_step)]
        lines.append(
            f"validation pass rate: {_fmt(first.get('pass_rate'), '.3f', 'n/a')} "
            f"(step {first['step']}) -> {_fmt(last.get('pass_rate'), '.3f', 'n/a')} "
            f"(step {last['step']}), {len(by_step)} eval points"
        )
        for domain in sorted(last.get("per_domain") or {}):
            before = (first.get("per_domain") or {}).get(domain)
            lines.append(
                f"  {domain}: {_fmt(before, '.3f', 'n/a')} -> "
                f"{_fmt(last['per_domain'][domain], '.3f', 'n/a')}"
            )
        compute = last.get("compute") or {}
        if compute:
            lines.append(
                "compute: "
                + ", ".join(
                    f"{_fmt(compute.get(key), '.3g', 'n/a')} {unit}"
                    for key, unit in (
                        ("device_hours", "device-hours"),
                        ("flops", "FLOPs"),
                        ("tokens", "tokens"),
                    )
                )
            )
    else:
        lines.append("validation pass rate: no eval points")
    lines.append(_fit_line("fit", fit, fit_reason, x_label))
    for domain, dfit in (domain_fits or {}).items():
        lines.append(
            _fit_line(
                f"  fit {domain}", None if "reason" in dfit else dfit, dfit.get("reason"), x_label
            )
        )
    tb_dir, fit_dir = os.path.join(workdir, "tensorboard"), os.path.join(workdir, "fit")
    lines += [f"files: {workdir}", f"  metrics      {os.path.join(workdir, 'metrics.jsonl')}"]
    if os.path.isdir(tb_dir):
        lines.append(f"  tensorboard  tensorboard --logdir {tb_dir}")
    model_dir = os.path.join(workdir, "model")
    if os.path.isdir(model_dir):
        lines.append(f"  model        {model_dir} (HF checkpoint)")
    lines.append(
        f"  fit          {fit_dir}"
        if os.path.isdir(fit_dir)
        else f"  fit          python experiments/fit.py {workdir}"
    )
    return lines
