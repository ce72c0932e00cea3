"""Git value origin (skill use, the git domain): in a repository's history, the commit that last gave a setting
the value it holds now. Knobs: ``commits`` (history length), ``decoys`` (later commits whose messages name the
setting but change others: ``git log --grep`` finds them first) and ``returns`` (times the setting left its final
value and came back: the first commit that set it, ``log -S`` read oldest first, is not the answer)."""

from __future__ import annotations

import random
import zlib
from collections.abc import Mapping
from typing import Any, ClassVar

import msgspec

from .._kit import WORDS, Commit, git_repo
from .._pattern import Material, Pattern, Precondition, RubricItem, answer_items, register, write_answer_py

_FILE = "settings.ini"
_SUFFIXES = ("timeout", "limit", "retries", "port", "workers", "ttl", "depth")
_PLAIN = ("tune defaults", "sync settings", "update configuration", "adjust limits", "config cleanup")


class Config(msgspec.Struct, frozen=True):
    commits: int
    decoys: int
    returns: int


def _ini(values: Mapping[str, str]) -> bytes:
    return "".join(f"{k} = {v}\n" for k, v in sorted(values.items())).encode()


@register
class GitValueOrigin(Pattern):
    id = "git-value-origin"
    dimension = "skill-use"
    domains = frozenset({"git"})
    summary = "the commit that last gave a setting its current value, in a repository's history"
    goal = "trace where a setting's value came from in a repository's history"
    config = Config
    knobs: ClassVar[dict[str, tuple[int, ...]]] = {
        "commits": (6, 10, 16, 24),
        "decoys": (0, 1, 3, 5),
        "returns": (0, 1, 2),
    }
    primary = "commits"

    def build(self, cfg: Config, rng: random.Random, ns: str, cid: str) -> Material:
        keys = [f"{w}_{rng.choice(_SUFFIXES)}" for w in rng.sample(WORDS, 6)]
        target, others = keys[0], keys[1:]
        final = str(rng.randrange(100, 1000))
        returns = min(cfg.returns, (cfg.commits - 3) // 2)  # what fits the history (a knob set alone may not)
        changes = 2 * returns + 1  # away from the final value and back, then the last change to it
        # Commit 0 sets every key; the target changes at `changes` later commits; after its last change come the
        # decoys (as many as fit) and at least one plain commit, so HEAD is never the answer.
        decoys = min(cfg.decoys, cfg.commits - 2 - changes)
        last = rng.randrange(changes, cfg.commits - 1 - decoys)
        at = [*sorted(rng.sample(range(1, last), changes - 1)), last]
        values = {k: str(rng.randrange(100, 1000)) for k in keys}
        values[target] = str(int(final) + 1 + rng.randrange(50))  # not the final value to begin with
        after = list(range(last + 1, cfg.commits))
        decoy_at = set(rng.sample(after[:-1], decoys)) if decoys else set()
        history: list[Commit] = []
        t = 1_700_000_000 + rng.randrange(86_400)
        for i in range(cfg.commits):
            if i == 0:
                message = "initial settings"
            elif i in at:
                k = at.index(i)
                # final at the last change and at every second one before it (left and came back)
                back = k == changes - 1 or (changes - 1 - k) % 2 == 0
                away = str(int(final) + 1 + rng.randrange(50))
                values[target] = final if back else away
                message = rng.choice([*_PLAIN, f"adjust {target}"])
            else:
                other = rng.choice(others)
                values[other] = str(rng.randrange(100, 1000))
                message = f"revisit {target} next to {other}" if i in decoy_at else rng.choice(_PLAIN)
            t += 600 + rng.randrange(7_200)
            history.append(Commit({_FILE: _ini(values)}, message, t))
        repo, shas = git_repo(history)
        files = {f"{ns}/repo/{p}": data for p, data in repo.items()}
        facts = {"commit": shas[last]}
        git = f"['git', '-c', 'safe.directory=*', '-C', {ns + '/repo'!r}]"
        why = f"why_{cid}.md"  # judged (a top-level file of the workspace: the judge reads nothing deeper)
        sol = (
            (
                "import subprocess\n"
                "def _git(*a):\n"
                f"    return subprocess.run([*{git}, *a], capture_output=True, text=True, check=True).stdout\n"
                "def _value(sha):\n"
                f"    for line in _git('show', sha + ':{_FILE}').splitlines():\n"
                "        k, _, v = line.partition(' = ')\n"
                f"        if k == {target!r}:\n            return v\n"
                "found, before = None, None\n"
                "for sha in _git('log', '--format=%H', '--reverse').split():\n"
                "    v = _value(sha)\n"
                "    if v != before:\n        found = sha\n"
                "    before = v\n"
            )
            + write_answer_py(cid, "{'commit': found}")
            + (
                f"open({why!r}, 'w').write('Reading `{_FILE}` at every commit, oldest first (`git log --reverse`, "
                f"`git show <commit>:{_FILE}`), `{target}` last changed to the value it holds now in ' + found + "
                "'; every later commit leaves it as it is, so earlier commits that set the same value, and later "
                "commit messages that name it, are not the answer.\\n')\n"
            )
        )
        log = ["git", "-c", "safe.directory=*", "-C", f"{ns}/repo", "log", "--oneline"]
        return Material(
            files=files,
            instruction=(
                f"`{ns}/repo/` is a git repository. Which commit last changed `{target}` in `{_FILE}` to the value "
                f'it holds now? Write `{{"commit": "<its full 40-character hash>"}}` to `answers/{cid}.json`, '
                f"and explain in `{why}` how the history shows it."
            ),
            facts=facts,
            rubric=[
                *answer_items(cid, facts),
                # The reasoning, for an LLM judge (left out of the reward where none is configured): a guessed or
                # searched-for hash with no account of the history earns the answer's credit only. The criterion
                # does not name the answer: the judge's prompt is recorded, and the answer is the check's to verify.
                RubricItem(
                    id=f"{cid}.why",
                    challenge=cid,
                    weight=0.5,
                    kind="judge",
                    file=why,
                    criterion=(
                        f"names the commit it found and explains from the repository's history why it is the last "
                        f"commit that gave `{target}` in `{_FILE}` its current value: the setting's changes "
                        "read in order, later commits leaving it unchanged; an account that rests on a commit "
                        "message naming the setting, or on the first commit that set the same value, is wrong"
                    ),
                ),
            ],
            solution=sol,
            given=[f"the setting {target}", f"the file {_FILE}"],
            discover=["the repository's history of the setting"],
            infer=["the last commit that gave it its current value"],
            evidence=[f"{ns}/repo/{_FILE}", f"{ns}/repo/.git"],
            preconditions=[Precondition(what="the repository's history reads", argv=log, expect_exit="zero")],
            bins=("bash", "python3", "git"),
        )

    def measure(self, files: Mapping[str, bytes], facts: Mapping[str, Any], ns: str) -> float:
        objects = (data for p, data in files.items() if p.startswith(f"{ns}/repo/.git/objects/"))
        return float(sum(1 for data in objects if zlib.decompress(data).startswith(b"commit ")))
