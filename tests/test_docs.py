"""The README and docs/ cannot go stale: their command outputs, --help texts and tables are re-made here (issue 16).

The blocks are filled by scripts/refresh_docs.py; a failing test prints the block as it should read now, and
`python scripts/refresh_docs.py` rewrites them all.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
README = ROOT / "README.md"


def _load_script():
    spec = importlib.util.spec_from_file_location("refresh_docs", ROOT / "scripts" / "refresh_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


docs = _load_script()
BLOCKS = [b for path in docs.documents() for b in docs.blocks(path)]
NEEDS_TORCH = {"measured"}  # and every `help: hw ...` block: hw's commands import torch


def _needs_torch(block) -> bool:
    return block.kind in NEEDS_TORCH or (block.kind == "help" and block.arg.startswith("hw"))


def documented_commands(paths: list[Path]) -> list[tuple[str, str]]:
    """(document, command) for each `$ python -m parsim|hw ...` line of their code blocks, pipes cut off."""
    found = []
    for path in paths:
        for line in path.read_text().splitlines():
            if line.startswith("$ python -m "):
                found.append((path.name, line[2:].split(" | ")[0]))
    return found


def readme_parsim_commands() -> list[str]:
    """Every `python -m parsim ...` the README shows, in code blocks or inline, up to a pipe, `&&` or backtick,
    except the accuracy loop's (it names a shell variable; its own test runs it)."""
    return [m.strip() for m in re.findall(r"python -m parsim[^|&`\n]*", README.read_text()) if "$" not in m]


def readme_accuracy_loop() -> str:
    """The README's shell loop that prints each accuracy row again with `parsim compare`."""
    (line,) = [line for line in README.read_text().splitlines() if line.startswith("for f in ")]
    return line


def parse(command: str):
    """The command's arguments as its tool's parser reads them (a flag that does not exist fails here)."""
    tool, *argv = shlex.split(command)[2:]
    if tool == "parsim":
        from parsim.cli import build_parser

        return build_parser().parse_args(argv)
    pytest.importorskip("torch")
    from hw.__main__ import parser_for

    return parser_for(argv[0])[0].parse_args(argv)


def test_readme_is_read_in_five_minutes():
    assert len(README.read_text()) < 8000


def test_every_block_kind_is_used():
    assert {b.kind for b in BLOCKS} == set(docs.FILL)
    helps = {b.arg for b in BLOCKS if b.kind == "help"}
    assert {"parsim predict", "parsim sweep", "parsim plan", "parsim scenario", "parsim compare",
            "hw measure", "hw calibrate", "hw validate", "hw scenario"} <= helps


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: b.name)
def test_generated_block_matches_what_the_code_and_data_give_now(block):
    if _needs_torch(block):
        pytest.importorskip("torch")
    fresh = docs.filled(block)
    assert docs.same(block, fresh), (f"{block.name} is out of date; `python scripts/refresh_docs.py` rewrites it "
                                     f"to:\n{fresh}")


def test_every_parsim_command_in_the_readme_runs_against_the_shipped_profile():
    commands = readme_parsim_commands()
    in_blocks = {docs.command_of(b.body).split(" | ")[0] for b in BLOCKS if b.kind == "run" and b.path == README}
    assert len(commands) >= 4 and in_blocks <= set(commands)
    for command in set(commands) - in_blocks:  # those in run blocks ran above, output compared
        argv, _ = docs.split_pipe(command)
        assert "step time" in docs.run_parsim(argv)


def test_the_readmes_accuracy_loop_covers_every_row_and_prints_its_figures(tmp_path):
    loop = readme_accuracy_loop()
    csvs = set(subprocess.run(["bash", "-c", loop.split("; do ")[0].replace("for f in ", "printf '%s\\n' ", 1)],
                              capture_output=True, text=True, check=True).stdout.split())
    (block,) = [b for b in BLOCKS if b.kind == "accuracy" and b.path == README]
    rows = [re.search(r"\]\(([^)#]+\.csv)(?:#runtime=([\w-]+))?\)", line) for line in block.body.splitlines()[2:]]
    assert csvs == {row[1] for row in rows} and "--profile parsim/profiles/default.json" in loop
    row = rows[-1]  # the smallest CSV, run as the loop runs it: its lines give the row's figures
    (cells,) = [line for line in block.body.splitlines() if row[1] in line]
    one = loop.replace(loop.split("; do ")[0], f"for f in {row[1]}").replace("/tmp/parsim-accuracy", str(tmp_path))
    out = subprocess.run(["bash", "-c", one], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    every, bound = re.findall(r"(\d+) points .*?median \|error\| ([\d.]+%), worst ([\d.]+%)", out)
    assert f"| {every[0]} ({bound[0]}) | {every[1]} / {every[2]} | {bound[1]} / {bound[2]} |" in cells
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results-speedups.png", "results-step-times.png"]


@pytest.mark.parametrize("document,command", documented_commands([README, *sorted((ROOT / "docs").glob("*.md"))]))
def test_every_documented_command_parses(document, command):
    parse(command)


@pytest.mark.parametrize("command", sorted({  # with measurements.md, which holds the README's calibrate log
    c for _, c in documented_commands([README, ROOT / "docs" / "measurements.md"]) if " -m hw " in c}))
def test_the_readmes_hw_commands_answer_help(command):
    pytest.importorskip("torch")
    sub = shlex.split(command)[3]
    assert docs.help_text(f"hw {sub}").startswith(f"usage: python -m hw {sub}")


def test_the_documented_hw_measure_runs_on_the_cpu_with_a_tiny_model():
    pytest.importorskip("torch")
    command = next(c for _, c in documented_commands([ROOT / "docs" / "measurements.md"])
                   if c.startswith("python -m hw measure"))
    tiny = ["--cpu", "--layers", "2", "--hidden", "16", "--tokens", "16", "--steps", "2", "--warmup", "1"]
    result = subprocess.run([sys.executable, *shlex.split(command)[1:], *tiny], capture_output=True, text=True,
                            cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("measured: 1f1b on 2 x cpu, 8 micro-batches")


@pytest.mark.parametrize("command", ["parsim predict", "parsim sweep", "parsim plan", "parsim scenario",
                                     "parsim compare", "hw measure", "hw calibrate", "hw validate", "hw scenario"])
def test_each_commands_help_opens_with_the_question_it_answers(command):
    if command.startswith("hw"):
        pytest.importorskip("torch")
    text = docs.help_text(command)
    first = text.split("\n\n")[1]  # the paragraph after the usage lines
    assert "\n" not in first and "?" in first and len(first) <= 80


def test_the_readme_names_every_notebook():
    named = set(re.findall(r"notebooks/([\w.-]+\.ipynb)", README.read_text()))
    assert named == {p.name for p in (ROOT / "notebooks").glob("*.ipynb")}


@pytest.mark.parametrize("path", [README, *sorted((ROOT / "docs").rglob("*.md"))], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_leads_to_a_file(path):
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", path.read_text())
    missing = [link for link in links if "://" not in link and not (path.parent / link).exists()]
    assert not missing


# --- the script's own behaviour --------------------------------------------------------------------------------

def test_a_stale_run_block_is_found_and_rewritten(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("text\n<!-- run -->\n```text\n$ python -m parsim predict --gpus 2 | head -n 1\nold\n```\n"
                   "<!-- end -->\nmore\n")
    (block,) = docs.blocks(doc)
    assert not docs.same(block, docs.filled(block))
    assert docs.refresh_document(doc)
    assert doc.read_text() == ("text\n<!-- run -->\n```text\n$ python -m parsim predict --gpus 2 | head -n 1\n"
                               "parsim prediction: 1f1b on 2 GPU(s), 8 micro-batches\n```\n<!-- end -->\nmore\n")
    assert not docs.refresh_document(doc)  # now current


def test_files_a_run_block_writes_land_in_a_scratch_folder_shown_under_their_given_name():
    out = docs.run_parsim(["predict", "--gpus", "2", "--plot", "not-here/step.png"])
    assert "step time" in out and not (ROOT / "not-here").exists()


@pytest.mark.parametrize("body,message", [
    ("```text\n$ python -m hw calibrate\nnot a line of the log\n```\n", "not lines of"),
    ("```text\n$ python -m hw calibrate\n```\n", None),
    ("no fence\n", None),
])
def test_a_log_excerpt_must_be_lines_of_its_log(tmp_path, body, message):
    (tmp_path / "run.log").write_text("fit  fixed\nwrote profile.json\n")
    block = docs.Block(tmp_path / "doc.md", "log", "run.log", body, 1)
    if message is None and body.startswith("```"):
        assert docs.filled(block) == body
    else:
        with pytest.raises(docs.DocError, match=message or "one fenced code block"):
            docs.filled(block)


def test_a_failing_command_is_an_error_naming_the_block():
    block = docs.Block(ROOT / "README.md", "run", "", "```text\n$ python -m parsim predict --gpus 0\n```\n", 7)
    with pytest.raises(docs.DocError, match="README.md:7 run: .* exited 2: error: argument --gpus"):
        docs.filled(block)


def test_check_exits_1_on_a_stale_block_and_0_once_rewritten(tmp_path, monkeypatch, capsys):
    doc = tmp_path / "doc.md"
    doc.write_text("<!-- run -->\n```text\n$ python -m parsim scenario multi-gpu | tail -n 1\n```\n<!-- end -->\n")
    monkeypatch.setattr(docs, "documents", lambda: [doc])
    assert docs.main(["--check"]) == 1 and "out of date: " in capsys.readouterr().err
    assert docs.main([]) == 0 and "all_over_one_ratio" in doc.read_text()
    assert docs.main(["--check"]) == 0


def test_the_readme_keeps_the_two_set_up_commands_and_ci_runs_the_second():
    text = README.read_text()
    assert "\npip install . && python -m parsim predict --schedule 1f1b --gpus 4\n" in text
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci == 'pip install "torch==2.13.0" -e ".[hw,models,test]" && ruff check && mypy && python -m pytest -q -n 2'
    assert f"\n{ci}\n" in text


def _output_paths(command: str) -> list[str]:
    words = shlex.split(command)
    return [words[i + 1] for i, word in enumerate(words[:-1]) if word in docs.OUTPUT_FLAGS]


def test_no_readme_command_writes_into_the_repository():
    """A reader who runs the README's commands in a clone leaves `git status` clean: every file they write is
    outside it, and `compare` (which writes its plots to the current folder by default) is given --out."""
    commands = [*readme_parsim_commands(), readme_accuracy_loop(),
                *(c for _, c in documented_commands([README]) if " -m hw " in c)]
    for command in commands:
        paths = _output_paths(command)
        assert all(Path(p).is_absolute() and not Path(p).resolve().is_relative_to(ROOT) for p in paths), command
        assert " compare " not in command or "--out" in command.split(), command


def test_a_run_block_naming_a_file_keeps_its_plot_there_on_a_refresh(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("<!-- run: figures/t.png -->\n```text\n$ python -m parsim predict --gpus 2 --plot /tmp/t.png "
                   "| head -n 1\n```\n<!-- end -->\n")
    assert docs.refresh_document(doc)
    assert (tmp_path / "figures" / "t.png").read_bytes()[:4] == b"\x89PNG"
    doc.write_text("<!-- run: t.png -->\n```text\n$ python -m parsim predict --gpus 2\n```\n<!-- end -->\n")
    with pytest.raises(docs.DocError, match="draws no --plot"):
        docs.refresh_document(doc)
