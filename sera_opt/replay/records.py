"""Recorded runs: the per-rollout rewards of a training run, step by step.

Two formats are read.

**verl's rollout dump** (``trainer.rollout_data_dir``, verl 0.9.1): a folder of
``{step}.jsonl`` files, one per training step, one line per rollout, as written by
``_write_generations`` in ``verl/trainer/ppo/ray_trainer.py`` and
``verl/trainer/ppo/v1/trainer_base.py``. Each line holds ``input`` (the decoded
prompt), ``output``, ``gts``, ``score`` (the sum of the rollout's token-level
scores), ``step`` and the reward function's extra fields (the v1 trainer adds
``uid``). The replay reads ``step`` (it must equal the file's number), ``score``
(the reward, 0 or 1) and the prompt's id: the field named by ``id_field`` when
given, otherwise the ``input`` text itself. verl's ``uid`` is a fresh random id per
prompt and step, so it cannot name a prompt across steps; the text can.

**The plain schema**: a table with one row per rollout and the columns ``step``
(a whole number), ``prompt_id`` (any text or number), ``reward`` (0 or 1) and
optionally ``epoch`` (a whole number), as CSV (a header row), JSONL (one object per
line) or Parquet (when pyarrow is installed). Rows are in step order; within a step
their order does not matter. Other columns are ignored.

A malformed record raises :class:`RecordError`, one line naming the file, the line
(the row, for Parquet) and the field; no line is skipped.
"""

from __future__ import annotations

import csv
import json
import math
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..exceptions import SeraOptError

__all__ = ["RecordError", "RecordedRun", "RecordedStep", "read_record", "read_verl_dump",
           "read_table", "write_verl_dump", "write_table", "PLAIN_FIELDS", "VERL_FIELDS",
           "EPOCH_RULE"]

#: The plain schema's columns: required, then optional.
PLAIN_FIELDS = ("step", "prompt_id", "reward")
PLAIN_OPTIONAL = ("epoch",)
#: The fields of a verl dump line that the replay reads (the id: ``input`` unless
#: ``id_field`` names another).
VERL_FIELDS = ("step", "score", "input")
#: How epochs are found when the record has no ``epoch`` column.
EPOCH_RULE = ("a new epoch begins at the first step that holds a prompt already seen in "
              "the current epoch (one pass over the prompts per epoch)")

_STEP_FILE = re.compile(r"^(\d+)\.jsonl$")


class RecordError(SeraOptError):
    """A recorded run is malformed: the message names the file, the line and the field."""


@dataclass(frozen=True)
class RecordedStep:
    """One training step of a recorded run.

    Attributes
    ----------
    step : int
        The step's number in the record.
    epoch : int
        The epoch it belongs to (from the record, or by :data:`EPOCH_RULE`).
    prompts : ndarray of int64, shape (M,)
        The step's prompts, as indices into :attr:`RecordedRun.prompt_keys`, in order of
        first appearance in the step.
    counts : ndarray of int64, shape (M,)
        Rollouts recorded per prompt.
    successes : ndarray of int64, shape (M,)
        Successes among them.
    rewards : ndarray of int8, shape (sum(counts),)
        The rollouts' rewards grouped by prompt (the prompts' groups in the order of
        :attr:`prompts`, each group in record order).
    """

    step: int
    epoch: int
    prompts: np.ndarray
    counts: np.ndarray
    successes: np.ndarray
    rewards: np.ndarray

    @property
    def num_prompts(self) -> int:
        return int(self.prompts.shape[0])

    @property
    def budget(self) -> int:
        """The step's recorded rollouts: the budget every arm plans."""
        return int(self.counts.sum())


@dataclass(frozen=True)
class RecordedRun:
    """A recorded run: its steps in order and the prompts' keys.

    Attributes
    ----------
    steps : tuple of RecordedStep
    prompt_keys : tuple
        The prompts' ids as the record gives them (``prompt_id``, or the verl ``input``
        text); a step's ``prompts`` index into it.
    source : str
        Where it was read from.
    format : str
        ``"verl"``, ``"csv"``, ``"jsonl"``, ``"parquet"`` or ``"arrays"``.
    epoch_source : str
        ``"record"`` when the record gave the epochs, otherwise :data:`EPOCH_RULE`.
    """

    steps: tuple[RecordedStep, ...]
    prompt_keys: tuple
    source: str = ""
    format: str = "arrays"
    epoch_source: str = EPOCH_RULE

    @property
    def num_steps(self) -> int:
        return len(self.steps)

    @property
    def num_rollouts(self) -> int:
        return int(sum(s.budget for s in self.steps))

    @property
    def num_epochs(self) -> int:
        return len({s.epoch for s in self.steps})

    def describe(self) -> str:
        m = [s.num_prompts for s in self.steps]
        return (f"{self.num_steps} steps, {min(m)} to {max(m)} prompts per step, "
                f"{len(self.prompt_keys)} distinct prompts, {self.num_rollouts} rollouts, "
                f"{self.num_epochs} epoch(s)")

    @classmethod
    def from_rollouts(cls, steps, prompt_ids, rewards, epochs=None, *, source: str = "",
                      format: str = "arrays", where: Callable[[int], str] | None = None
                      ) -> RecordedRun:
        """A run from one entry per rollout: its step, its prompt's id, its reward (0 or
        1) and, optionally, its epoch. Steps must not decrease; a step's epoch is one
        number; epochs must not decrease. ``where(i)`` names rollout ``i`` in errors
        (default: ``rollout i``)."""
        steps = np.asarray(steps, dtype=np.int64)
        rewards = np.asarray(rewards)
        where = where or (lambda i: f"rollout {i}")
        n = steps.shape[0]
        if n == 0:
            raise RecordError(f"{source or 'the record'} holds no rollouts; a replay needs at "
                              f"least one step's rewards.")
        if rewards.shape != (n,) or len(prompt_ids) != n:
            raise RecordError("steps, prompt ids and rewards need one entry per rollout each.")
        if rewards.dtype.kind not in "biu":
            bad = np.flatnonzero(~np.isin(rewards, (0, 1)))
            if bad.size:
                raise RecordError(f"{where(int(bad[0]))}: field 'reward' is "
                                  f"{rewards[bad[0]]!r}; rewards must be 0 or 1.")
        elif rewards.size and (rewards.min() < 0 or rewards.max() > 1):
            i = int(np.flatnonzero((rewards < 0) | (rewards > 1))[0])
            raise RecordError(f"{where(i)}: field 'reward' is {rewards[i]!r}; rewards must be "
                              f"0 or 1.")
        back = np.flatnonzero(np.diff(steps) < 0)
        if back.size:
            i = int(back[0]) + 1
            raise RecordError(f"{where(i)}: field 'step' is {steps[i]} after step "
                              f"{steps[i - 1]}: rollouts must come in step order (sort the "
                              f"rows by step).")
        keys: dict[Any, int] = {}
        codes = np.fromiter((keys.setdefault(k, len(keys)) for k in prompt_ids),
                            dtype=np.int64, count=n)
        rewards = rewards.astype(np.int8)
        starts = np.flatnonzero(np.r_[True, np.diff(steps) != 0])
        ends = np.r_[starts[1:], n]
        epoch_values = None
        if epochs is not None:
            epoch_values = np.asarray(epochs, dtype=np.int64)
            back = np.flatnonzero(np.diff(epoch_values) < 0)
            if back.size:
                i = int(back[0]) + 1
                raise RecordError(f"{where(i)}: field 'epoch' is {epoch_values[i]} after "
                                  f"epoch {epoch_values[i - 1]}: epochs must not decrease.")
        out, seen, epoch = [], set(), 0
        for start, end in zip(starts, ends):
            step_codes = codes[start:end]
            unique, first, inverse = np.unique(step_codes, return_index=True,
                                               return_inverse=True)
            # the step's prompts in order of first appearance, each group in record order
            appear = np.argsort(first, kind="stable")
            rank = np.empty_like(appear)
            rank[appear] = np.arange(appear.shape[0])
            row_rank = rank[inverse.reshape(-1)]
            grouped = np.argsort(row_rank, kind="stable")
            prompts = unique[appear]
            step_counts = np.bincount(row_rank, minlength=appear.shape[0])
            step_rewards = rewards[start:end][grouped]
            successes = np.bincount(row_rank, weights=rewards[start:end],
                                    minlength=appear.shape[0]).astype(np.int64)
            if epoch_values is not None:
                values = epoch_values[start:end]
                if values.min() != values.max():
                    i = int(start + np.flatnonzero(values != values[0])[0])
                    raise RecordError(f"{where(i)}: field 'epoch' is {values[i - start]} "
                                      f"within step {steps[start]} of epoch {values[0]}: a "
                                      f"step belongs to one epoch.")
                epoch = int(values[0])
            else:
                present = set(prompts.tolist())
                if seen & present:
                    epoch, seen = epoch + 1, set()
                seen |= present
            out.append(RecordedStep(step=int(steps[start]), epoch=epoch,
                                    prompts=prompts.astype(np.int64),
                                    counts=step_counts.astype(np.int64),
                                    successes=successes.astype(np.int64),
                                    rewards=step_rewards))
        return cls(steps=tuple(out), prompt_keys=tuple(keys), source=source, format=format,
                   epoch_source="record" if epochs is not None else EPOCH_RULE)


# --------------------------------------------------------------------------- reading


def read_record(path, *, id_field: str | None = None, progress: Callable | None = None
                ) -> RecordedRun:
    """Read a recorded run: a verl dump folder, or a ``.csv``, ``.jsonl`` (``.json``) or
    ``.parquet`` file in the plain schema.

    Parameters
    ----------
    path : str or Path
    id_field : str, optional
        verl dumps only: the line field that holds the prompt's id (for example one the
        reward function adds); default: the prompt's text, ``input``.
    progress : callable, optional
        ``progress(iterable, total=..., desc=...)`` wraps the reading loop (a tqdm bar).
    """
    path = Path(path)
    if path.is_dir():
        return read_verl_dump(path, id_field=id_field, progress=progress)
    if id_field is not None:
        raise RecordError(f"id_field applies to verl dump folders; {str(path)!r} is a file in "
                          f"the plain schema, whose ids are its 'prompt_id' column.")
    return read_table(path, progress=progress)


def _line_where(name: str) -> Callable[[int, int], str]:
    return lambda line, _=0: f"{name}, line {line}"


def _reward(value: Any, where: str, field: str) -> int:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float)) and value in (0, 1):
        return int(value)
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if number in (0.0, 1.0):
            return int(number)
    raise RecordError(f"{where}: field {field!r} is {value!r}; the replay needs binary "
                      f"rewards, 0 or 1 (map the score to success or failure before replaying, "
                      f"e.g. write a plain-schema file with reward = score > 0).")


def _whole(value: Any, where: str, field: str) -> int:
    if isinstance(value, bool):
        raise RecordError(f"{where}: field {field!r} is {value!r}, not a whole number.")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        text = value.strip()
        if re.fullmatch(r"[+-]?\d+", text):
            return int(text)
    raise RecordError(f"{where}: field {field!r} is {value!r}, not a whole number.")


def read_verl_dump(folder, *, id_field: str | None = None, progress: Callable | None = None
                   ) -> RecordedRun:
    """Read verl's rollout dump folder (see the module docstring for the fields read)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise RecordError(f"{str(folder)!r} is not a folder of verl's {{step}}.jsonl files.")
    files, strays = [], []
    for entry in folder.iterdir():
        match = _STEP_FILE.match(entry.name)
        if match:
            files.append((int(match.group(1)), entry))
        elif entry.suffix == ".jsonl":
            strays.append(entry.name)
    if strays:
        raise RecordError(f"{str(folder)!r} holds {', '.join(sorted(strays))}: verl names each "
                          f"step's file by its number ({{step}}.jsonl); move other files out.")
    if not files:
        raise RecordError(f"{str(folder)!r} holds no {{step}}.jsonl files; point at the folder "
                          f"given as trainer.rollout_data_dir.")
    files.sort()
    key_field = id_field or "input"
    steps, ids, rewards = [], [], []
    wrapped = files if progress is None else progress(files, total=len(files),
                                                      desc="reading steps")
    try:
        _read_verl_files(wrapped, key_field, steps, ids, rewards)
    finally:
        _close(wrapped)
    return RecordedRun.from_rollouts(steps, ids, np.asarray(rewards, dtype=np.int8),
                                     source=str(folder), format="verl")


def _close(bar) -> None:
    """Close a progress bar, also when reading stopped at an error (its line is cleared
    before the error is printed)."""
    close = getattr(bar, "close", None)
    if close is not None:
        close()


def _read_verl_files(files, key_field: str, steps: list, ids: list, rewards: list) -> None:
    for number, path in files:
        name = str(path)
        count = 0
        with open(path, encoding="utf-8") as fh:
            for line_no, line in enumerate(fh, 1):
                where = f"{name}, line {line_no}"
                if not line.strip():
                    raise RecordError(f"{where}: empty line; verl writes one JSON object per "
                                      f"line.")
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise RecordError(f"{where}: not JSON ({exc.msg}).") from None
                if not isinstance(entry, dict):
                    raise RecordError(f"{where}: not a JSON object.")
                for field in ("step", "score", key_field):
                    if field not in entry:
                        raise RecordError(f"{where}: field {field!r} is missing.")
                step = _whole(entry["step"], where, "step")
                if step != number:
                    raise RecordError(f"{where}: field 'step' is {step} in the file of step "
                                      f"{number}; a step's rollouts are in its own file.")
                key = entry[key_field]
                if not isinstance(key, (str, int)) or isinstance(key, bool):
                    raise RecordError(f"{where}: field {key_field!r} is {key!r}; a prompt id "
                                      f"is text or a whole number.")
                steps.append(step)
                ids.append(key)
                rewards.append(_reward(entry["score"], where, "score"))
                count += 1
        if count == 0:
            raise RecordError(f"{name}: the file is empty; every step's file holds its "
                              f"rollouts, one per line.")


def _rows_csv(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    with open(path, newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        try:
            header = next(reader)
        except StopIteration:
            raise RecordError(f"{path}: the file is empty; the plain schema needs a header row "
                              f"({', '.join(PLAIN_FIELDS)}[, epoch]) and one row per "
                              f"rollout.") from None
        header = [h.strip() for h in header]
        for field in PLAIN_FIELDS:
            if field not in header:
                raise RecordError(f"{path}, line 1: the header has no field {field!r} (it "
                                  f"reads {', '.join(header)}); the plain schema's columns "
                                  f"are {', '.join(PLAIN_FIELDS)}[, epoch].")
        width = len(header)
        for row in reader:
            line = reader.line_num
            if not row or all(not cell.strip() for cell in row):
                raise RecordError(f"{path}, line {line}: empty row; give one row per rollout.")
            if len(row) != width:
                raise RecordError(f"{path}, line {line}: {len(row)} fields where the header "
                                  f"has {width}.")
            yield line, dict(zip(header, row))


def _rows_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    with open(path, encoding="utf-8") as fh:
        for line_no, line in enumerate(fh, 1):
            if not line.strip():
                raise RecordError(f"{path}, line {line_no}: empty line; give one JSON object "
                                  f"per rollout.")
            try:
                entry = json.loads(line)
            except json.JSONDecodeError as exc:
                raise RecordError(f"{path}, line {line_no}: not JSON ({exc.msg}).") from None
            if not isinstance(entry, dict):
                raise RecordError(f"{path}, line {line_no}: not a JSON object.")
            yield line_no, entry


def _rows_parquet(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise RecordError(f"{path}: reading Parquet needs pyarrow (pip install pyarrow); or "
                          f"write the record as CSV or JSONL.") from None
    table = pq.read_table(path)
    for field in PLAIN_FIELDS:
        if field not in table.column_names:
            raise RecordError(f"{path}: the table has no column {field!r}; the plain schema's "
                              f"columns are {', '.join(PLAIN_FIELDS)}[, epoch].")
    names = [n for n in (*PLAIN_FIELDS, *PLAIN_OPTIONAL) if n in table.column_names]
    columns = {n: table.column(n).to_pylist() for n in names}
    for i in range(table.num_rows):
        yield i + 1, {n: columns[n][i] for n in names}


def read_table(path, *, progress: Callable | None = None) -> RecordedRun:
    """Read a plain-schema record (``.csv``, ``.jsonl``/``.json``, ``.parquet``)."""
    path = Path(path)
    if not path.is_file():
        raise RecordError(f"{str(path)!r} does not exist (give a verl dump folder or a .csv, "
                          f".jsonl or .parquet file).")
    suffix = path.suffix.lower()
    readers = {".csv": (_rows_csv, "csv"), ".jsonl": (_rows_jsonl, "jsonl"),
               ".json": (_rows_jsonl, "jsonl"), ".parquet": (_rows_parquet, "parquet")}
    if suffix not in readers:
        raise RecordError(f"{path}: unknown format {suffix or '(no suffix)'!r}; use .csv, "
                          f".jsonl or .parquet, or a verl dump folder.")
    rows, kind = readers[suffix]
    label = "row" if kind == "parquet" else "line"
    steps, ids, rewards, epochs = [], [], [], []
    lines: list[int] = []
    has_epoch = None
    wrapped: Iterable = rows(path)
    if progress is not None:
        wrapped = progress(wrapped, total=None, desc="reading rollouts")
    try:
        for line, entry in wrapped:
            where = f"{path}, {label} {line}"
            for field in PLAIN_FIELDS:
                if field not in entry or entry[field] is None or entry[field] == "":
                    raise RecordError(f"{where}: field {field!r} is missing.")
            if has_epoch is None:
                has_epoch = entry.get("epoch") not in (None, "")
            if has_epoch:
                if entry.get("epoch") in (None, ""):
                    raise RecordError(f"{where}: field 'epoch' is missing (earlier rows give it; "
                                      f"give it on every row or on none).")
                epochs.append(_whole(entry["epoch"], where, "epoch"))
            elif entry.get("epoch") not in (None, ""):
                raise RecordError(f"{where}: field 'epoch' is given, but earlier rows have none; "
                                  f"give it on every row or on none.")
            steps.append(_whole(entry["step"], where, "step"))
            key = entry["prompt_id"]
            if isinstance(key, bool) or not isinstance(key, (str, int, float)):
                raise RecordError(f"{where}: field 'prompt_id' is {key!r}; a prompt id is text or a "
                                  f"number.")
            ids.append(key)
            rewards.append(_reward(entry["reward"], where, "reward"))
            lines.append(line)
    finally:
        _close(wrapped)
    if not steps:
        raise RecordError(f"{path}: the file is empty (no rollouts); the plain schema has one "
                          f"row per rollout with {', '.join(PLAIN_FIELDS)}[, epoch].")
    return RecordedRun.from_rollouts(
        steps, ids, np.asarray(rewards, dtype=np.int8), epochs if has_epoch else None,
        source=str(path), format=kind, where=lambda i: f"{path}, {label} {lines[i]}")


# --------------------------------------------------------------------------- writing


def write_verl_dump(folder, steps: Iterable[tuple[int, list[str], list[str], list[float]]],
                    *, gts: Callable[[str], Any] | None = None) -> Path:
    """Write rollouts as verl 0.9.1 dumps them: ``folder/{step}.jsonl``, one line per
    rollout with ``input``, ``output``, ``gts``, ``score`` and ``step``.

    ``steps`` yields ``(step, inputs, outputs, scores)``; ``gts(input)`` gives a line's
    ground truth (default None).
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for step, inputs, outputs, scores in steps:
        with open(folder / f"{int(step)}.jsonl", "w", encoding="utf-8") as fh:
            for text, output, score in zip(inputs, outputs, scores, strict=True):
                entry = {"input": text, "output": output,
                         "gts": gts(text) if gts is not None else None,
                         "score": float(score), "step": int(step)}
                fh.write(json.dumps(entry, ensure_ascii=False) + "\n")
    return folder


def write_table(path, run: RecordedRun, *, epochs: bool = False) -> Path:
    """Write ``run`` in the plain schema (``.csv`` or ``.jsonl`` by ``path``'s suffix), one
    row per rollout; ``epochs=True`` adds the ``epoch`` column."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".csv", ".jsonl"):
        raise RecordError(f"{path}: write_table writes .csv or .jsonl.")
    fields = [*PLAIN_FIELDS, *(("epoch",) if epochs else ())]
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh) if suffix == ".csv" else None
        if writer is not None:
            writer.writerow(fields)
        for s in run.steps:
            ids = np.repeat(s.prompts, s.counts)
            for code, reward in zip(ids.tolist(), s.rewards.tolist()):
                row = [s.step, run.prompt_keys[code], reward, *((s.epoch,) if epochs else ())]
                if writer is not None:
                    writer.writerow(row)
                else:
                    fh.write(json.dumps(dict(zip(fields, row))) + "\n")
    return path
