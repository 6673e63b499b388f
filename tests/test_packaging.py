"""setup.py: the distribution name install hints use, and the extras the suite needs."""
import ast
from pathlib import Path

from ripples.core import distribution

SETUP = Path(__file__).resolve().parent.parent / "setup.py"


def setup_arguments():
    tree = ast.parse(SETUP.read_text())
    names = {target.id: node.value for node in tree.body if isinstance(node, ast.Assign)
             for target in node.targets if isinstance(target, ast.Name)}
    call = next(node for node in ast.walk(tree) if isinstance(node, ast.Call)
                and getattr(node.func, "id", "") == "setup")

    def value(node):
        if isinstance(node, ast.Name):
            return value(names[node.id])
        if isinstance(node, ast.List):
            items = []
            for item in node.elts:
                items += value(item.value) if isinstance(item, ast.Starred) else [value(item)]
            return items
        if isinstance(node, ast.Dict):
            return {value(k): value(v) for k, v in zip(node.keys, node.values)}
        return ast.literal_eval(node)
    return {kw.arg: value(kw.value) for kw in call.keywords
            if kw.arg in ("name", "install_requires", "extras_require", "entry_points")}


def test_distribution_name_is_the_one_install_hints_name():
    assert setup_arguments()["name"] == distribution.NAME == "ripples-mpi"
    assert distribution.pip_install("openmpi") == "pip install 'ripples-mpi[openmpi]'"
    assert distribution.pip_install() == "pip install ripples-mpi"


def test_demo_dependencies_are_an_extra_that_the_test_extra_includes():
    args = setup_arguments()
    demo = {"matplotlib", "scikit-learn"}
    assert not demo & set(args["install_requires"])
    assert set(args["extras_require"]["demo"]) == demo
    assert demo | {"pytest>=7,<9.2"} <= set(args["extras_require"]["test"])
    assert sorted(args["entry_points"]["console_scripts"]) == [
        "ripples=ripples.runner.info:main", "ripplesrun=ripples.runner.launch:main"]
