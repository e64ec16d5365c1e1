"""The README's paper-to-code map names code that exists, and the docs link files that exist."""

import importlib
import importlib.util
import pathlib
import re

from test_architecture import FOLDERS as LAYER_FOLDERS

REPO = pathlib.Path(__file__).resolve().parents[1]
MODULE_PREFIXES = ("", *(f"{f}." for f in LAYER_FOLDERS))  # where a bare module name may live: the top, a layer folder


def map_rows():
    text = (REPO / "README.md").read_text()
    table = text.split("## From the paper to the code", 1)[1].split("\n## ", 1)[0]
    return [line for line in table.splitlines() if line.startswith("|") and "---" not in line][1:]


def resolve(module, dotted: str) -> bool:
    obj = module
    for part in dotted.split("."):
        if not hasattr(obj, part):
            return False
        obj = getattr(obj, part)
    return True


def test_every_name_in_the_paper_to_code_map_exists():
    checked = 0
    for row in map_rows():
        code = row.rsplit("|", 2)[1]
        module = None
        for token in re.findall(r"`([^`]+)`", code):
            path = re.match(r"(patjax(?:_torch)?/[a-z_/]+)\.py(?::\s*(.*))?$", token)
            if path:  # `patjax/x.py: name`: the names that follow belong to module x
                if path.group(1).startswith("patjax_torch") and importlib.util.find_spec("torch") is None:
                    module = None  # the PyTorch networks need torch ([bench]); only their file is checked
                    assert (REPO / f"{path.group(1)}.py").exists(), path.group(1)
                    continue
                module = importlib.import_module(path.group(1).replace("/", "."))
                folder = (REPO / path.group(1)).parent
                token = path.group(2) or ""
            if token.endswith(".py"):  # `apgd.py` after `patjax/evaluators/attack.py`: a sibling file
                assert (folder / token).exists(), f"README map: {folder / token} does not exist"
                continue
            name = re.match(r"^([A-Za-z_][A-Za-z_0-9]*(?:\.[A-Za-z_][A-Za-z_0-9]*)*)(\(.*\))?$", token)
            if not name:
                continue
            dotted = name.group(1)
            head = dotted.split(".")[0]
            if head in ("patjax", "config", "eval", "cfg"):
                continue
            owner = module  # `robustness.lower_bound`: a module of the package (in any folder), then a name in it
            found = [
                f"patjax.{f}{head}"
                for f in MODULE_PREFIXES
                if importlib.util.find_spec(f"patjax.{f}{head}".rstrip("."))
            ]
            if found:
                owner = importlib.import_module(found[0])
                dotted = dotted.split(".", 1)[1] if "." in dotted else None
            if owner is None or dotted is None:
                continue
            registered = any(dotted in getattr(owner, r, {}) for r in ("MODELS", "REGISTRY"))
            assert resolve(owner, dotted) or registered, (
                f"README map: {owner.__name__} has no {dotted!r} ({row[:50]}...)"
            )
            checked += 1
    assert checked > 40


def test_relative_links_in_readme_and_docs_point_to_files():
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "benchmarks" / "README.md"]:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", doc.read_text()):
            assert (doc.parent / target).exists(), f"{doc.relative_to(REPO)} links {target}, which does not exist"
