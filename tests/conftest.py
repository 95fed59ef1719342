"""Shared fixtures: the locally trained tokenizer, tiny models, the one tiny config (the packaged ``tiny.yaml``, also
``dgrpo demo --quick``), a short SFT checkpoint, and running the command line in-process or as a subprocess."""

import contextlib
import fcntl
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import settings

# the suite runs in parallel workers (pytest-xdist, pyproject's addopts), each with its own OpenMP pool: waits must
# yield the core (OpenMP's default spins, and two spinning workers on two cores run the fast tier 3x slower); set
# before torch loads OpenMP, inherited by the workers and by the subprocesses the tests start
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

# one intra-op thread per worker (and per run the tests start, TEST_SETS' threads): two workers on two cores are
# the parallelism, and the tiny models gain nothing from a second thread each (four threads on two cores ran the
# fast tier in 73 s, two in 51 s)
torch.set_num_threads(1)

# the property tests draw the same examples in every run, so that a run's result depends on the code alone;
# ``pytest --hypothesis-profile=explore`` draws new ones (how the fuzz test of the data loaders found a bug)
settings.register_profile("repeatable", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile("repeatable")

#: every test starts from the same global RNG state (torch, random), so that what a test draws does not depend on
#: which tests ran before it in its worker (a tolerance met by most draws failed CI on one); ``DGRPO_TEST_SEED=N``
#: runs the suite from another state, to find a test that holds for one draw only
TEST_SEED = int(os.environ.get("DGRPO_TEST_SEED", "0"))


@pytest.fixture
def default_sigterm():
    """SIGTERM's default action back after the test (a test that installs dgrpo's handler and raises through it),
    so that the worker's next test starts as a process does. Used by a module's ``pytestmark``."""
    yield
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


@pytest.fixture
def set_umask():
    """``set_umask(0o022)``: this process's umask for the test (a checkpoint's file modes follow it); the caller's is
    back after it."""
    before = os.umask(0o022)
    os.umask(before)
    yield os.umask
    os.umask(before)


@pytest.fixture(autouse=True)
def _same_draws_in_any_order():
    import random

    random.seed(TEST_SEED)
    # (torch.manual_seed's CPU part, and CUDA's where there is one: torch.manual_seed also queues a lazy seeding of
    # every accelerator type torch knows, formatting the caller's stack each time, ~0.5 ms per test on a CPU machine)
    torch.default_generator.manual_seed(TEST_SEED)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(TEST_SEED)


#: the real data files: $DGRPO_DATA_DIR when set, else ../shared/data beside the checkout (development and CI); the
#: tests that read them skip when the folder is absent
SHARED_DATA = Path(os.environ.get("DGRPO_DATA_DIR") or Path(__file__).resolve().parents[2] / "shared" / "data")
if SHARED_DATA.is_dir():
    os.environ.setdefault("DGRPO_DATA_DIR", str(SHARED_DATA))
TINY = "tiny.yaml"  # the packaged tiny-model config every end-to-end test starts from
#: the shape of the tiny GPT-2 bases the Coconut import tests save (their checkpoints in the official run.py's layout)
COCONUT_BASE_SHAPE = {"hidden_size": 32, "num_layers": 2, "num_heads": 4, "intermediate_size": 64}
#: what the tests change on top of tiny.yaml (4-step problems, K = 4, longer answers, 1 thread)
TEST_SETS = {
    "task.n_steps": 4,
    "data.test": "[builtin:test]",
    "eval.batch_size": 64,
    "eval.max_new_tokens": 40,
    "grpo.steps": 3,
    "grpo.group_size": 4,
    "grpo.max_new_tokens": 40,
    "perturbation.p": 0.1,
    "threads": 1,
}


@pytest.fixture(scope="session")
def tokenizer():
    from dgrpo.config import TaskConfig
    from dgrpo.data.synthetic import tokenizer_corpus
    from dgrpo.data.tokenizer import train_task_tokenizer

    return train_task_tokenizer(tokenizer_corpus(TaskConfig()))


@pytest.fixture(scope="session")
def task_records():
    from dgrpo.config import TaskConfig
    from dgrpo.data.synthetic import generate_split

    return generate_split(TaskConfig(n_test=64), "test")


def windowed_qwen2_config():
    """A 2-layer Qwen2 config whose second layer is a sliding-window one (the first full, ``max_window_layers=1``)."""
    from transformers import Qwen2Config

    return Qwen2Config(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        use_sliding_window=True,
        sliding_window=4,
        max_window_layers=1,
    )


def make_lm(tokenizer, arch="qwen2", seed=0, **kw):
    import copy

    from dgrpo.model.latent_lm import LatentLM
    from dgrpo.model.tiny import build_tiny_model

    tok = copy.deepcopy(tokenizer)
    kw = {"hidden_size": 32, "num_layers": 2, "num_heads": 4, "intermediate_size": 64, **kw}
    return LatentLM(build_tiny_model(arch, len(tok), seed=seed, **kw), tok)


def save_shards(folder: Path, state: dict) -> Path:
    """``state`` saved as torch.distributed.checkpoint shards in ``folder/dcp`` (one process); ``folder``."""
    import torch.distributed.checkpoint as dcp

    dcp.save(state, checkpoint_id=str(folder / "dcp"))
    return folder


def sharded_final(tmp_path: Path, tokenizer, change, lm=None) -> tuple[Path, int]:
    """``tmp_path/final`` as fsdp=sharded writes it (config and tokenizer, its shards, a manifest), the shards
    holding the model's state (``lm``'s, a new tiny model's without it) as ``change`` (state -> None) leaves it; and
    the model's norm length."""
    from dgrpo.model.verified import atomic_dir

    lm = lm or make_lm(tokenizer)
    state = dict(lm.model.state_dict())
    n = state["model.norm.weight"].shape[0]
    change(state)
    staging = save_shards(tmp_path / "staging", state)
    with atomic_dir(tmp_path / "final") as d:
        lm.save_pretrained(d, weights=False)
        shutil.move(staging / "dcp", d / "dcp")
    return tmp_path / "final", n


@pytest.fixture(scope="session")
def lora_base_dirs(tokenizer, tmp_path_factory):
    """Tiny models of 2 layers saved on disk (LoRA adapts a model with a name or path): a tied Qwen2, an untied
    Llama, a tied GPT-2 (Conv1D layers); read only (a test that changes one works on a copy)."""
    root = tmp_path_factory.mktemp("lora-base")
    for arch in ("qwen2", "llama", "gpt2"):
        make_lm(tokenizer, arch).save_pretrained(root / arch)
    return root


def grpo_run_dir(out: Path, cfg=None, **kw):
    """A GRPO RunDir on ``out`` (one process, quiet; ``cfg``: tiny_config() by default)."""
    from dgrpo.training.distributed import Dist
    from dgrpo.training.run import RunDir

    return RunDir(out, cfg or tiny_config(), Dist.single(), "grpo", log=lambda m: None, **kw)


def state_only_checkpoint(path: Path) -> Path:
    """A folder that reads as a GRPO resumable checkpoint (its state.json), without weights."""
    path.mkdir(parents=True)
    (path / "state.json").write_text(json.dumps({"trainer": {}}))
    return path


def loads_no_base(ckpt: Path) -> SimpleNamespace:
    """A stand-in for RunDir.resume's loader: a checkpoint of no base model."""
    return SimpleNamespace(base=None)


def sft_run_between_steps(cfg, *, dist=None, steps_per_epoch: int = 4, prog=None, opt=None):
    """An SFTRun with only what enter_stage, step, train_epoch and save read, without a model (a test replaces
    sft_step): ``prog`` a fresh Progress unless given, no optimizer yet unless ``opt``, one process unless ``dist``."""
    from dgrpo.training.curriculum import Curriculum, Progress
    from dgrpo.training.distributed import Dist
    from dgrpo.training.guards import NonFiniteGuard
    from dgrpo.training.sft import SFTRun

    run = object.__new__(SFTRun)
    run.cfg, run.prog, run.opt, run.dist = cfg, prog or Progress(), opt, dist or Dist.single()
    run.params = [torch.nn.Parameter(torch.zeros(2))]
    run.plan = Curriculum(cfg, steps_per_epoch=steps_per_epoch)
    run.guard, run.lm = NonFiniteGuard(cfg.sft.max_nonfinite, "SFT", "sft.lr"), SimpleNamespace()  # type: ignore[assignment]
    return run


def raising_command(exc: BaseException):
    """A command function (``args -> exit code``) that raises ``exc``: what the command line does with it is tested."""

    def func(args) -> int:
        raise exc

    return func


def scripted_alternate(monkeypatch, module, *runs):
    """``module.alternate`` gives each call, in turn, the next run's (times, results) instead of timing: the
    candidates it was given must be the run's names; each is called once (what it runs is faked by the test)."""
    from dgrpo.bench.timing import Timed

    runs_left = list(runs)

    def fake(fns, *, reps, warmup=1, device=None, log=None):
        times, results = runs_left.pop(0)
        assert set(fns) == set(times)
        for f in fns.values():  # (each once: what it calls is faked by the test)
            f()
        return Timed(dict(times), {k: results.get(k, [None] * len(v)) for k, v in times.items()})

    monkeypatch.setattr(module, "alternate", fake)


def bench_tiny_shapes():
    """The bench's smallest shapes (``dgrpo.bench.workload.Shapes``): what tests that drive its items use."""
    from dgrpo.bench.workload import Shapes

    return Shapes(name="tiny", hidden=16, layers=1, heads=4, kv_heads=2, ffn=8, prompts=2, reps=3, warmup=1)


def bench_ctx(shapes=None, device="cpu"):
    """A bench item's context (``dgrpo.bench.workload.Ctx``) in float32 on ``device``, over ``shapes`` (default
    :func:`bench_tiny_shapes`), logging nothing."""
    from dgrpo.bench.workload import Ctx

    return Ctx(torch.device(device), torch.float32, shapes or bench_tiny_shapes(), log=lambda msg: None)


def written_with_manifest(directory: Path, files: dict[str, str]) -> Path:
    """``directory`` holding ``files`` (relative path -> text) and a manifest of them."""
    from dgrpo.model.verified import write_manifest

    for rel, text in files.items():
        (directory / rel).parent.mkdir(parents=True, exist_ok=True)
        (directory / rel).write_text(text)
    write_manifest(directory)
    return directory


def write_run(path: Path, config: dict | list | None, rows: list[dict], *, head: str = "", tail: str = "") -> Path:
    """A run folder as ``dgrpo plot`` reads it: ``config.json`` (none when ``config`` is None) and ``metrics.jsonl``
    holding ``rows``, with raw text before (``head``) or after (``tail``: a torn last line) them."""
    path.mkdir(parents=True)
    if config is not None:
        (path / "config.json").write_text(json.dumps(config))
    (path / "metrics.jsonl").write_text(head + "".join(json.dumps(r) + "\n" for r in rows) + tail)
    return path


def distinct_markers(lm) -> None:
    """Give the latent markers (start, latent, end) distinct random input rows: the tiny models add them as the mean
    row, one and the same vector, so a marker fed as another would go unseen."""
    weight = lm.model.get_input_embeddings().weight
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for tid in (lm.start_id, lm.latent_id, lm.end_id):
            weight[tid] = torch.randn(weight.shape[1], generator=gen)


def scored_with_grad(lm, ids, mask, n_latent, tg, tm):
    """Teacher-forced log-probs (detached, fp32) and the input embedding's gradient of their masked sum."""
    lm.model.zero_grad(set_to_none=True)
    lp, _ = lm.target_logprobs(ids, mask, n_latent, tg, tm)
    (-(lp * tm).sum()).backward()
    return lp.detach().float(), lm.model.get_input_embeddings().weight.grad.float()


def kv_column_bytes(lm, rows):
    """Bytes of one column of one layer's keys and values together, over ``rows`` rows, in the weights' dtype."""
    cfg = lm.model.config
    heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    return 2 * rows * heads * head_dim * next(lm.model.parameters()).element_size()


def sets(d: dict) -> list[str]:
    """``--set k=v`` arguments for a dict of overrides."""
    return [x for k, v in d.items() for x in ("--set", f"{k}={v}")]


def tiny_config(**over):
    """The Config of the tests: tiny.yaml, then TEST_SETS, then ``over``."""
    from dgrpo.config import Config, load_config

    return load_config(Config, TINY, [f"{k}={v}" for k, v in {**TEST_SETS, **over}.items()])


def default_config(*overrides: str):
    """The default Config with ``overrides`` applied as ``--set`` gives them, validated."""
    from dgrpo.config import Config, load_config

    return load_config(Config, overrides=list(overrides))


def config_refusal(key: str, *overrides: str) -> str:
    """The one-line message that refuses ``overrides`` over the default Config; it must name ``key``."""
    from dgrpo.config import ConfigError

    with pytest.raises(ConfigError, match=rf"^invalid config value {key}: ") as e:
        default_config(*overrides)
    return str(e.value)


def tiny_args(**over) -> list[str]:
    """The same config as command-line arguments."""
    return ["--config", TINY, *sets({**TEST_SETS, **over})]


def dgrpo(*args, timeout=300, env=None):
    """``python -m dgrpo ARGS`` in a subprocess (for what must be a real process: kills, exit codes of crashes)."""
    return subprocess.run(
        [sys.executable, "-m", "dgrpo", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def child_pids(pid: int | None = None) -> set[int]:
    """The child processes of ``pid`` (default: this process) that still exist, zombies included (Linux /proc)."""
    pids: set[int] = set()
    for f in Path(f"/proc/{os.getpid() if pid is None else pid}/task").glob("*/children"):
        try:
            pids.update(int(p) for p in f.read_text().split())
        except OSError:  # the thread exited between the listing and the read
            continue
    return {p for p in pids if Path(f"/proc/{p}").exists()}


def process_alive(pid: int) -> bool:
    """``pid`` exists and is not a zombie (Linux /proc)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def files_state(root: Path) -> list[tuple[str, int]]:
    """The files under ``root`` with their sizes: what a run writes changes it (new rows, new files). The run goes on
    meanwhile: a folder it removes while this walks it (an old checkpoint) is skipped, where ``rglob`` raised."""
    state = []
    for folder, _, names in os.walk(root):  # (os.walk passes over a folder it can no longer list)
        for name in names:
            f = Path(folder) / name
            with contextlib.suppress(OSError):  # (a file renamed or removed between the listing and the stat)
                state.append((str(f), f.stat().st_size))
    return sorted(state)


def wait_until(done, proc: subprocess.Popen, why: str, progress, idle_s: float = 120, cap_s: float = 570) -> None:
    """Poll ``done()`` until it is true while ``proc`` runs. Fails with ``why`` when ``proc`` ended, or when
    ``progress()`` (e.g. :func:`files_state` of its output) stayed the same for ``idle_s`` seconds (stuck), or after
    ``cap_s`` seconds in all (under pytest-timeout's 600 s for the whole test): a busy machine makes a run slower,
    which a fixed deadline took for a hang."""
    start = last = time.monotonic()
    seen = progress()
    while not done():
        if proc.poll() is not None:  # (done() again: it may have come true as the process ended)
            assert done(), f"{why} (it ended, exit {proc.returncode})"
            return
        now = time.monotonic()
        assert now - last < idle_s, f"{why} (nothing new for {idle_s:.0f} s)"
        assert now - start < cap_s, f"{why} (not in {cap_s:.0f} s)"
        if (state := progress()) != seen:
            seen, last = state, now
        time.sleep(0.2)


def run_script(path, argv, monkeypatch, capsys) -> tuple[int | str, str, str]:
    """``python PATH ARGV`` run in this process, as ``__main__`` (``runpy``): (its exit code, its stdout, its
    stderr). The script's own code path, without a fresh interpreter's ~3.6-4.5 s of torch and transformers imports
    (for a script whose test reads what it prints and writes, not the process: kills, memory, a clean import); an
    exception out of the script (a traceback) fails the test. torch's thread count, which a script may set, is put
    back."""
    import runpy

    monkeypatch.setattr(sys, "argv", [str(path), *map(str, argv)])
    threads = torch.get_num_threads()
    capsys.readouterr()
    code: int | str | None = 0
    try:
        runpy.run_path(str(path), run_name="__main__")
    except SystemExit as e:
        code = e.code
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr()
    return (0 if code is None else code), out.out, out.err


class Result:
    def __init__(self, returncode: int, stdout: str, stderr: str):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


@pytest.fixture
def run_cli(capsys):
    """``dgrpo ARGS`` in this process (``dgrpo.cli.main``): exit code, stdout, stderr."""
    from dgrpo.cli import main

    def run(*args) -> Result:
        capsys.readouterr()
        try:
            rc = main([str(a) for a in args])
        except SystemExit as e:  # argparse errors
            rc = e.code if isinstance(e.code, int) else 2
        out = capsys.readouterr()
        return Result(rc, out.out, out.err)

    return run


@pytest.fixture(scope="session")
def sft_checkpoint(tmp_path_factory):
    """A tiny built-in-task model after a short Coconut SFT (stage 0 -> 1), saved in HF format; read only (a test
    that changes it works on a copy). Trained once per run: the xdist workers share it through their common
    temporary folder, the first to need it training it while the others wait."""
    from dgrpo.data.synthetic import generate_split
    from dgrpo.model.factory import load_model
    from dgrpo.training.sft import train_sft

    base = tmp_path_factory.getbasetemp()
    # an xdist worker's folder sits in the run's (without xdist, as on a GPU node: the run's folder itself)
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    out, done = root / "sft-checkpoint", root / "sft-checkpoint.done"
    with open(root / "sft-checkpoint.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # (released when the file closes)
        if not done.exists():
            # half tiny.yaml's training set at twice its lr: 64 steps, ~6 s (a model good enough that groups have
            # mixed rewards and the filter keeps some; its accuracy means nothing)
            cfg = tiny_config(**{"task.n_train": 1024, "sft.lr": 6e-3})
            torch.manual_seed(0)
            lm = load_model(cfg.model, cfg.task, seed=0)
            shutil.rmtree(out, ignore_errors=True)  # (what a run stopped while training left)
            train_sft(lm, generate_split(cfg.task, "train"), cfg, out, log=lambda *a: None)
            done.touch()
    return out / "final"


#: a perturbation kind of one's own (``FILE:Deaf``) whose from_config leaves ``perturb_answer`` true: refused under
#: ``perturbation.perturb_answer=false``
DEAF_KIND = """
from dgrpo.perturbation import Perturbation


class Deaf(Perturbation):
    from_config = classmethod(lambda cls, cfg: cls())
"""


@pytest.fixture
def capture_requests(monkeypatch) -> list[bool]:
    """Every LatentChain made in the test runs uncaptured (the capture itself is CUDA's) and appends here whether it
    was asked to capture."""
    from dgrpo.model.latent_chain import LatentChain

    asked: list[bool] = []
    init = LatentChain.__init__

    def recording_init(self, lm, n_latent, capture):
        asked.append(capture)
        init(self, lm, n_latent, False)

    monkeypatch.setattr(LatentChain, "__init__", recording_init)
    return asked


def faked_sft_run(monkeypatch, cfg, records, resumed=None):
    """An SFTRun built on ``records`` with its run directory, model and kernels faked: a fresh start, or with
    ``resumed`` (a loaded checkpoint: its ``apply(lm, opt, dist)`` gives the saved state) a resume."""
    from types import SimpleNamespace

    from dgrpo.training import sft as sft_module
    from dgrpo.training.distributed import Dist

    run_dir = SimpleNamespace(
        resume=lambda read: resumed,
        check_same_data=lambda *a: None,
        drop_stale_best=lambda state: False,
        start=lambda state, applied: None,
    )
    dist = Dist.single()
    dist.broadcast_weights = lambda model: None
    dist.prepare_model = lambda model: [torch.nn.Parameter(torch.ones(2))]
    monkeypatch.setattr(sft_module, "apply_speedups", lambda lm, model_cfg: [])
    monkeypatch.setattr(sft_module, "check_restart", lambda *a: None)
    monkeypatch.setattr(sft_module.SFTRun, "applied", lambda self, opt: {})
    lm = SimpleNamespace(use_recompute=lambda *a: None, model=None)
    return sft_module.SFTRun(lm, cfg, dist, run_dir, records)


#: completions whose votes and scores the scoring tests compare, and the golds they are read against
VOTE_POOL = [
    "#### 5",
    "#### 5.0",
    "#### 5,000",
    "#### 5000",
    "5",
    "The answer is 5.",
    "#### Tom",
    "#### tom.",
    "# Tom",
    "#### B",
    "#### (B) a tree",
    "#### b",
    "#### 2.50",
    "#### $2.5",
    "#### 2.5 dollars",
    "####",
    "none",
    "#### C#",
]
VOTE_GOLDS = ["5", "5000", "2.5", "Tom", "B", "C#"]


def vote_pairs(scorer):
    """Every pair of :data:`VOTE_POOL`'s completions read against each of :data:`VOTE_GOLDS`, with each one's vote
    (``vote_key``) and score under ``scorer``: ``(gold, (a, vote, score), (b, vote, score))``."""
    from dgrpo.data.records import Record
    from dgrpo.eval.evaluate import vote_key

    for gold in VOTE_GOLDS:
        scores = scorer(VOTE_POOL, [Record("q", [], gold)] * len(VOTE_POOL))
        keys = [vote_key(scorer, t, gold) for t in VOTE_POOL]
        for first, second in itertools.combinations(zip(VOTE_POOL, keys, scores), 2):
            yield gold, first, second
