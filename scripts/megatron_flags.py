#!/usr/bin/env python3
"""The flags Megatron-LM's pretrain_gpt.py parser accepts, read from a git mirror with `ast` (no torch, no import).

Reads megatron/training/arguments.py at core_v0.15.3 (every flag an explicit add_argument) and at HEAD (where many
flags come from dataclasses through ArgumentGroupFactory: a field `foo_bar` becomes --foo-bar; a bool field whose
default is not False becomes --no-foo-bar and --disable-foo-bar; `exclude=` and init=False fields are skipped; a
field's metadata["argparse_meta"] overrides names, nargs, type, action and choices; inherited fields come first).
Prints one flag per line: `--name arity [choices]`, arity one of switch (no value), value (one), optional (zero or
one), list (one or more). A flag in both commits is listed once (HEAD's arity). Not read: the optional
extra_args_provider of pretrain_gpt.py (NVIDIA ModelOpt's flags, present only when modelopt is installed).

Usage: scripts/megatron_flags.py --mirror DIR > tests/train/megatron_flags.txt
"""
import argparse
import ast
import subprocess
import sys

ARGS_FILE = "megatron/training/arguments.py"


def git(mirror, *args, check=True):
    return subprocess.run(["git", "-C", mirror, *args], check=check, capture_output=True, text=True).stdout


def const_list(node):
    """A literal list/tuple of constants, else None."""
    if isinstance(node, (ast.List, ast.Tuple)) and all(isinstance(e, ast.Constant) for e in node.elts):
        return [e.value for e in node.elts]
    return None


def arity_of(action, nargs):
    if action in ("store_true", "store_false", "store_const", "count", "help", "version"):
        return "switch"
    if nargs in ("+", "*") or (isinstance(nargs, int) and nargs > 1):
        return "list"
    if nargs == "?":
        return "optional"
    return "value"


class Extractor:
    def __init__(self, mirror, commit):
        self.mirror, self.commit = mirror, commit
        self.flags = {}  # name -> (arity, choices)
        self.class_cache = {}

    def source(self, path):
        return git(self.mirror, "show", f"{self.commit}:{path}")

    def add(self, names, arity, choices):
        for n in names:
            if n.startswith("--"):
                self.flags[n] = (arity, [str(c) for c in choices] if choices else [])

    def enum_choices(self, type_node, module_tree):
        """Member names of an Enum class named by `type_node` (argparse takes config_type[name]), else None."""
        name = type_node.id if isinstance(type_node, ast.Name) else None
        if name is None:
            return None
        found = self.find_class(name)
        if found is None:
            return None
        cls, _ = found
        if not any(isinstance(b, (ast.Name, ast.Attribute)) and "Enum" in ast.unparse(b) for b in cls.bases):
            return None
        members = []
        for st in cls.body:
            if isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name):
                members.append(st.targets[0].id)
        return members

    def find_class(self, name):
        if name in self.class_cache:
            return self.class_cache[name]
        if name in ("int", "float", "str", "bool", "dict", "tuple", "list", "Any", "Callable"):
            return None
        out = git(self.mirror, "grep", "-l", "-E", f"^class {name}\\b", self.commit, "--", "megatron", check=False)
        result = None
        for line in out.splitlines():
            path = line.split(":", 1)[1]
            tree = ast.parse(self.source(path))
            for node in tree.body:
                if isinstance(node, ast.ClassDef) and node.name == name:
                    result = (node, tree)
                    break
            if result:
                break
        self.class_cache[name] = result
        return result

    # --- explicit add_argument calls -------------------------------------------------------------------------
    def add_argument_call(self, call):
        names = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        kw = {k.arg: k.value for k in call.keywords if k.arg}
        action = kw["action"].value if isinstance(kw.get("action"), ast.Constant) else None
        nargs = kw["nargs"].value if isinstance(kw.get("nargs"), ast.Constant) else None
        if isinstance(kw.get("action"), ast.Attribute) and kw["action"].attr == "BooleanOptionalAction":
            # argparse.BooleanOptionalAction: --foo and --no-foo, both switches.
            action = "store_true"
            names = names + ["--no-" + n[2:] for n in names if n.startswith("--")]
        choices = const_list(kw["choices"]) if "choices" in kw else None
        if choices is None and "choices" in kw:
            # e.g. choices=list(AttnBackend) or [e.name for e in AttnBackend]
            for sub in ast.walk(kw["choices"]):
                if isinstance(sub, ast.Name) and sub.id[0].isupper():
                    choices = self.enum_choices(sub, None)
                    if choices:
                        break
        self.add(names, arity_of(action, nargs), choices)

    # --- ArgumentGroupFactory(Class, exclude=...) ----------------------------------------------------------------
    def dataclass_fields(self, name):
        found = self.find_class(name)
        assert found is not None, f"{self.commit}: class {name} not found"
        cls, tree = found
        fields = []
        for base in cls.bases:  # dataclasses.fields(): inherited fields first
            bname = base.id if isinstance(base, ast.Name) else (base.attr if isinstance(base, ast.Attribute) else None)
            if bname and bname not in ("object", "Generic") and self.find_class(bname) is not None:
                fields += self.dataclass_fields(bname)
        for st in cls.body:
            if not (isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name)):
                continue
            ann = st.annotation
            if isinstance(ann, ast.Constant) and isinstance(ann.value, str):
                ann = ast.parse(ann.value, mode="eval").body
            if "ClassVar" in ast.unparse(ann) or "InitVar" in ast.unparse(ann):
                continue
            fields = [f for f in fields if f[0] != st.target.id]  # a redefinition keeps the parent's place
            fields.append((st.target.id, ann, st.value))
        return fields

    def type_kwargs(self, ann):
        """_extract_type: (arity, choices, is_bool) or None when argparse type inference fails."""
        if isinstance(ann, ast.BinOp) and isinstance(ann.op, ast.BitOr):  # X | None
            if isinstance(ann.right, ast.Constant) and ann.right.value is None:
                return self.type_kwargs(ann.left)
            return None
        if isinstance(ann, ast.Subscript):
            head = ast.unparse(ann.value).split(".")[-1]
            args = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
            if head == "Optional":
                return self.type_kwargs(args[0])
            if head == "Union":
                if len(args) >= 2 and isinstance(args[1], ast.Constant) and args[1].value is None:
                    return self.type_kwargs(args[0])
                return None
            if head in ("list", "List"):
                if len(args) != 1:
                    return None
                inner = self.type_kwargs(args[0])
                return ("list", inner[1] if inner else [], False)
            if head == "Literal":
                return ("value", [a.value for a in args if isinstance(a, ast.Constant)], False)
            return ("value", [], False)  # other generics: a plain type call
        if isinstance(ann, ast.Name):
            if ann.id == "bool":
                return ("switch", [], True)
            members = self.enum_choices(ann, None)
            if members:
                return ("value", members, False)
        return ("value", [], False)

    def factory(self, call, exclude):
        cls_name = call.args[0].id if isinstance(call.args[0], ast.Name) else call.args[0].attr
        for name, ann, value in self.dataclass_fields(cls_name):
            if name in exclude:
                continue
            default, meta, init = value, None, True
            if isinstance(value, ast.Call) and ast.unparse(value.func).split(".")[-1] == "field":
                kw = {k.arg: k.value for k in value.keywords}
                default = kw.get("default")
                if "init" in kw and isinstance(kw["init"], ast.Constant) and kw["init"].value is False:
                    init = False
                if isinstance(kw.get("metadata"), ast.Dict):
                    for k, v in zip(kw["metadata"].keys, kw["metadata"].values):
                        if isinstance(k, ast.Constant) and k.value == "argparse_meta" and isinstance(v, ast.Dict):
                            meta = {mk.value: mv for mk, mv in zip(v.keys, v.values) if isinstance(mk, ast.Constant)}
            if not init:
                continue
            names = ["--" + name.replace("_", "-")]
            inferred = self.type_kwargs(ann)
            arity, choices = ("value", [])
            if inferred is not None:
                arity, choices, is_bool = inferred
                if is_bool:
                    default_false = isinstance(default, ast.Constant) and default.value is False
                    if not default_false:  # `attribute.default == False` fails: store_false, --no-/--disable-
                        names = ["--no-" + name.replace("_", "-"), "--disable-" + name.replace("_", "-")]
            else:
                assert meta is not None, f"{self.commit}: {cls_name}.{name}: type not inferable and no argparse_meta"
            if meta:
                if "arg_names" in meta and const_list(meta["arg_names"]):
                    names = const_list(meta["arg_names"])
                action = meta["action"].value if isinstance(meta.get("action"), ast.Constant) else None
                nargs = meta["nargs"].value if isinstance(meta.get("nargs"), ast.Constant) else None
                if action or "nargs" in meta:
                    arity = arity_of(action, nargs)
                elif "type" in meta and arity == "switch":
                    arity = "value"
                if "choices" in meta:
                    choices = const_list(meta["choices"]) or choices
            self.add(names, arity, choices)

    def run(self):
        tree = ast.parse(self.source(ARGS_FILE))
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef):
                continue
            local_lists = {}
            for st in ast.walk(fn):
                if isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name):
                    lst = const_list(st.value)
                    if lst is not None:
                        local_lists[st.targets[0].id] = lst
            for call in ast.walk(fn):
                if not isinstance(call, ast.Call):
                    continue
                fname = ast.unparse(call.func).split(".")[-1]
                if fname == "add_argument":
                    self.add_argument_call(call)
                elif fname == "ArgumentGroupFactory":
                    kw = {k.arg: k.value for k in call.keywords}
                    ex = kw.get("exclude")
                    exclude = set()
                    if ex is not None:
                        exclude = set(const_list(ex) if const_list(ex) is not None else local_lists[ex.id])
                    self.factory(call, exclude)
        return self.flags


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mirror", required=True, help="a git clone (bare or not) of NVIDIA/Megatron-LM")
    ap.add_argument("--release", default="core_v0.15.3")
    ap.add_argument("--head", default="HEAD")
    a = ap.parse_args()
    commits = [(a.release, git(a.mirror, "rev-parse", a.release + "^{commit}").strip()),
               (a.head, git(a.mirror, "rev-parse", a.head + "^{commit}").strip())]
    merged = {}
    for _, sha in commits:
        for name, val in Extractor(a.mirror, sha).run().items():
            old = merged.get(name, ("", []))[1]
            merged[name] = (val[0], old + [c for c in val[1] if c not in old])  # HEAD's arity, both's choices
    print("# Megatron-LM flags of pretrain_gpt.py's parser (megatron/training/arguments.py), union of two commits,")
    print("# made by scripts/megatron_flags.py (ast, no torch). Not included: NVIDIA ModelOpt's optional flags.")
    for tag, sha in commits:
        print(f"# {tag} = {sha}")
    print("# format: --flag arity [choice,choice,...]; arity: switch | value | optional | list")
    for name in sorted(merged):
        arity, choices = merged[name]
        print(f"{name} {arity}" + (" " + ",".join(choices) if choices else ""))


if __name__ == "__main__":
    sys.exit(main())
