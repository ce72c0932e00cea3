"""The task's grader, shipped as ``tests/grade.py`` (stdlib only: it runs in the task's substrate).

Usage: ``python3 grade.py RUBRIC.json WORKSPACE REWARD.json``. Writes Harbor's ``reward.json`` with the reward
only (``{"reward": x}``, the weighted mean over judged items: Harbor averages every key of it as a reward), and
beside it ``diagnostics.json``: ``item.<id>`` per item and ``unjudged_items``, the LLM-judged items left out
because no judge is configured (``Evaluation.diagnostics``). Reads only regular files of bounded size: a symlink
planted by the solver (to /dev/zero, outside the workspace) scores the item 0 instead of hanging or exhausting the
grader.

A ``command`` item runs the solution's own code, as the grader's user, in the grader's sandbox: that code must not
be able to write the reward. So the grader (``exec``'d by ``test.sh``: its death is the grading's, which the
verifier scores 0 unless the kernel's OOM killer did it) makes itself non-dumpable first (no ``/proc/<pid>/mem``,
``environ``, ``fd`` or ptrace for a process of the same user), removes any reward file already there, keeps only
the first ``MAX`` bytes of a command's output (a flood cannot exhaust its memory and leave a planted reward
behind), and after every command kills whatever was started since the grader began but is not the grader (a
daemon that ``setsid``'d away would otherwise rewrite the reward once it is written, or change what a later item
sees); the reward is written last, when nothing of the solution is left running.
"""

GRADER_SOURCE = r"""
import ctypes, json, os, selectors, shutil, signal, subprocess, sys, time

MAX = 1 << 20
TIMEOUT = 20
PR_SET_DUMPABLE = 4

def seal():
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: nothing of /proc to hide

def stat_of(pid):
    with open("/proc/%s/stat" % pid, "rb") as f:
        data = f.read()
    fields = data[data.rfind(b")") + 2 :].split()
    return fields[0], int(fields[1]), int(fields[19])  # state, parent, start time (clock ticks since boot)

def ancestors(me):
    out, pid = set(), me
    while pid > 1:
        try:
            pid = stat_of(pid)[1]
        except (OSError, IndexError, ValueError):
            break
        out.add(pid)
    return out

def end_strays(me, born, keep):
    # Anything started since the grader began, but the grader and its ancestors: what the commands left.
    # Killed until a scan finds none alive (a process forking in a loop is outrun: each scan kills its children).
    while True:
        found = 0
        try:
            names = os.listdir("/proc")
        except OSError:
            return
        for name in names:
            if not name.isdigit() or int(name) == me or int(name) in keep:
                continue
            try:
                state, _, start = stat_of(name)
            except (OSError, IndexError, ValueError):
                continue
            if start >= born and state not in (b"Z", b"X"):
                try:
                    os.kill(int(name), signal.SIGKILL)
                    found += 1
                except OSError:
                    pass
        while True:
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break
        if not found:
            return

def remove(path):
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass

def clear_rewards(out):
    # The reward's directory as a real directory, with no reward file of any kind in it.
    folder = os.path.dirname(out)
    if os.path.islink(folder) or (os.path.lexists(folder) and not os.path.isdir(folder)):
        remove(folder)
    os.makedirs(folder, exist_ok=True)
    for name in ("reward.json", "reward.txt", "diagnostics.json"):
        remove(os.path.join(folder, name))

def run(argv, ws, strays):
    # The exit code and at most MAX bytes of stdout, read as they come; None past MAX, past the time, or unstarted.
    try:
        p = subprocess.Popen(argv, cwd=ws, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             stdin=subprocess.DEVNULL, start_new_session=True)
    except OSError:
        strays()
        return None
    out, deadline = b"", time.monotonic() + TIMEOUT
    try:
        with selectors.DefaultSelector() as sel:
            sel.register(p.stdout, selectors.EVENT_READ)
            while len(out) <= MAX:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    return None
                chunk = os.read(p.stdout.fileno(), 1 << 16)
                if not chunk:
                    break
                out += chunk
        if len(out) > MAX:
            return None
        try:
            return p.wait(max(deadline - time.monotonic(), 0)), out
        except subprocess.TimeoutExpired:
            return None
    finally:
        p.stdout.close()
        strays()  # the command too, if it still runs

def read(ws, rel):
    path = os.path.join(ws, rel)
    if os.path.islink(path) or not os.path.isfile(path) or os.path.getsize(path) > MAX:
        return None
    with open(path, "rb") as f:
        return f.read(MAX).decode("utf-8", "replace")

def check(item, ws, strays):
    kind = item["kind"]
    if kind == "json_equals":
        text = read(ws, item["file"])
        try:
            data = json.loads(text) if text is not None else None
        except ValueError:
            return 0.0
        return 1.0 if isinstance(data, dict) and data.get(item["key"]) == item["expected"] else 0.0
    if kind == "json_constraint":
        text = read(ws, item["file"])
        try:
            data = json.loads(text) if text is not None else None
        except ValueError:
            return 0.0
        c = item["constraint"]
        if not isinstance(data, dict) or not all(
            type(data.get(v)) is int and c["lo"] <= data[v] <= c["hi"] for v in c["vars"]
        ):
            return 0.0
        lhs = sum(k * data[v] for k, v in zip(c["coef"], c["vars"]))
        ok = {"==": lhs == c["rhs"], "<=": lhs <= c["rhs"], ">=": lhs >= c["rhs"]}[c["op"]]
        return 1.0 if ok else 0.0
    if kind == "text_equals":
        text = read(ws, item["file"])
        return 1.0 if text is not None and text.strip() == item["expected"].strip() else 0.0
    if kind == "command":
        done = run(item["argv"], ws, strays)
        if done is None or done[0] != 0:
            return 0.0
        want = item.get("expect_stdout")
        return 1.0 if want is None or done[1].decode("utf-8", "replace").strip() == want.strip() else 0.0
    raise ValueError("unknown rubric kind " + repr(kind))

def main():
    seal()
    me = os.getpid()
    born = stat_of(me)[2]
    keep = ancestors(me)
    strays = lambda: end_strays(me, born, keep)
    rubric_path, ws, out = sys.argv[1:4]
    clear_rewards(out)  # one planted before the grader ran is not its verdict
    with open(rubric_path) as f:
        items = json.load(f)["items"]
    scores, total, got, unjudged = {}, 0.0, 0.0, 0
    for item in items:
        if item["kind"] == "judge":
            unjudged += 1
            continue
        s = check(item, ws, strays)
        scores["item." + item["id"]] = s
        total += item["weight"]
        got += item["weight"] * s
    diagnostics = dict(scores, unjudged_items=unjudged)
    strays()
    clear_rewards(out)  # what the commands put there (a symlink, a directory, a FIFO) is not written through
    # The diagnostics first, the reward last: Harbor's reward.json holds rewards only, which its job mean averages.
    for path, data in ((os.path.join(os.path.dirname(out), "diagnostics.json"), diagnostics),
                       (out, {"reward": round(got / total, 6) if total else 0.0})):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, sort_keys=True)

main()
"""

TEST_SH = """#!/bin/bash
# Grades the workspace (/app) against the rubric; writes /logs/verifier/reward.json.
# exec: the grader is the grading's process, so a solution that kills it ends the grading (scored 0), not a shell
# that would go on with whatever reward the solution wrote.
mkdir -p /logs/verifier
exec python3 /tests/grade.py /tests/rubric.json /app /logs/verifier/reward.json
"""

__all__ = ["GRADER_SOURCE", "TEST_SH"]
