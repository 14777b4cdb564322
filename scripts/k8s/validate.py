#!/usr/bin/env python3
"""Validate Kubernetes manifests against the API schema of one Kubernetes version, offline.

    target/venv-k8s/bin/python scripts/k8s/validate.py [--kubernetes-version 1.32.0] [--json] FILE...

Uses the `kubernetes-validate` package (PyPI), which bundles the OpenAPI schemas of every
Kubernetes version it supports; scripts/test.sh installs a pinned version of it in
target/venv-k8s. Validation is strict: a field the API does not know (a typo), a value of the
wrong type, a missing required field, an unknown kind or apiVersion, a key given twice in
one mapping, and a document that is not a mapping with apiVersion, kind and metadata.name are
all errors. (The package's own
command line only warns about an unknown kind, and accepts it.)

One line per document on stderr: `ok FILE[#N] kind/name` or `error FILE[#N] ...: what`.
With --json, stdout is one JSON object: {"kubernetes_version", "validator_version",
"documents": [{"file", "index", "kind", "name", "doc"}], "errors": [...]}, the documents
as parsed, so tests can check their content.

Exit status: 0 when every document is valid, 1 when any is not, 2 on a bad command line.
"""

import argparse
import json
import sys

try:
    import yaml
    from kubernetes_validate import utils as kv
    from kubernetes_validate.version import __version__ as kv_version
except ImportError as e:  # pragma: no cover - a usage error, not a validation result
    sys.exit(
        f"validate.py: {e}: run it with the Python of target/venv-k8s "
        "(scripts/test.sh creates it with kubernetes-validate)"
    )

# The Kubernetes version the examples are validated against (tests/k8s.rs passes it too).
DEFAULT_VERSION = "1.32.0"


class StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a key given twice in one mapping is an error
    (PyYAML keeps the last one silently; the API server's decoder refuses it)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark,
                    f"found the key {key!r} twice", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def where(path):
    """A JSON path such as spec.containers[0].env[1].value."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(document)"


def check_document(doc, version):
    """None when `doc` is valid for `version`, else a one-line reason."""
    if not isinstance(doc, dict):
        return f"not a mapping but a {type(doc).__name__}"
    for key in ("apiVersion", "kind"):
        if not isinstance(doc.get(key), str) or not doc.get(key):
            return f"no {key} (every Kubernetes object names its apiVersion and kind)"
    try:
        kv.validate(doc, version, strict=True)
    except kv.ValidationError as e:
        return f"{where(e.path)}: {e.message}"
    except kv.SchemaNotFoundError as e:
        return f"unknown kind or apiVersion: {e.message}"
    except kv.VersionNotSupportedError:
        return f"kubernetes-validate {kv_version} has no schema for Kubernetes {version}"
    except Exception as e:  # a schema the package cannot read, or a value jsonschema rejects
        return f"could not be validated: {type(e).__name__}: {e}"
    name = (doc.get("metadata") or {}).get("name")
    if not isinstance(name, str) or not name:
        return "no metadata.name"
    return None


def main():
    parser = argparse.ArgumentParser(description="strict, offline validation of Kubernetes manifests")
    parser.add_argument("-k", "--kubernetes-version", default=DEFAULT_VERSION)
    parser.add_argument("--json", action="store_true", help="print the parsed documents as JSON on stdout")
    parser.add_argument("files", nargs="+")
    args = parser.parse_args()

    documents, errors = [], []
    for path in args.files:
        try:
            with open(path, encoding="utf-8") as f:
                loaded = list(yaml.load_all(f, Loader=StrictLoader))
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
            errors.append(f"{path}: cannot be read as YAML: {' '.join(str(e).split())}")
            print(f"error {errors[-1]}", file=sys.stderr)
            continue
        loaded = [d for d in loaded if d is not None]  # `---` with nothing after it
        if not loaded:
            errors.append(f"{path}: holds no Kubernetes object")
            print(f"error {errors[-1]}", file=sys.stderr)
        for index, doc in enumerate(loaded):
            label = path if len(loaded) == 1 else f"{path}#{index}"
            reason = check_document(doc, args.kubernetes_version)
            if reason is not None:
                errors.append(f"{label}: {reason}")
                print(f"error {errors[-1]}", file=sys.stderr)
                continue
            kind, name = doc["kind"], doc["metadata"]["name"]
            print(f"ok {label} {kind.lower()}/{name} (Kubernetes {args.kubernetes_version}, strict)",
                  file=sys.stderr)
            documents.append({"file": path, "index": index, "kind": kind, "name": name, "doc": doc})

    if args.json:
        json.dump(
            {
                "kubernetes_version": args.kubernetes_version,
                "validator_version": kv_version,
                "documents": documents,
                "errors": errors,
            },
            sys.stdout,
        )
        print()
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
