#!/usr/bin/env python3
"""Writes a strict JSON schema per kind and version of CustomResourceDefinitions, named the way
kubeconform looks schemas up (`<kind>-<first group label>-<version>.json`, lower case).

    crd_schema.py OUT_DIR CRD.yaml...

Strict as the Kubernetes API server is with a structural schema: an object that declares
`properties` takes no other key unless it says `x-kubernetes-preserve-unknown-fields` or has
`additionalProperties` of its own; `nullable` admits null; `x-kubernetes-int-or-string` admits an
integer or a string. Used by scripts/chart-check.
"""

import json
import os
import sys

import yaml


def strict(node):
    """The OpenAPI v3 schema `node` as a JSON schema (draft 4 keywords), closed where the API
    server prunes unknown fields."""
    if isinstance(node, list):
        return [strict(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key in ("properties", "patternProperties", "definitions"):
            out[key] = {k: strict(v) for k, v in value.items()}
        elif key in ("items", "additionalProperties", "not", "allOf", "anyOf", "oneOf"):
            out[key] = strict(value)
        elif key == "nullable":
            continue
        else:
            out[key] = value
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not node.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def main():
    out_dir, files = sys.argv[1], sys.argv[2:]
    os.makedirs(out_dir, exist_ok=True)
    written = 0
    for path in files:
        with open(path, encoding="utf-8") as f:
            docs = [d for d in yaml.safe_load_all(f) if d]
        for crd in docs:
            if crd.get("kind") != "CustomResourceDefinition":
                continue
            spec = crd["spec"]
            kind = spec["names"]["kind"]
            group = spec["group"]
            for version in spec["versions"]:
                schema = strict(version["schema"]["openAPIV3Schema"])
                api_version = f"{group}/{version['name']}"
                props = schema.setdefault("properties", {})
                props["apiVersion"] = {"type": "string", "enum": [api_version]}
                props["kind"] = {"type": "string", "enum": [kind]}
                props["metadata"] = {"type": "object"}
                schema.setdefault("required", [])
                for key in ("apiVersion", "kind", "metadata"):
                    if key not in schema["required"]:
                        schema["required"].append(key)
                name = f"{kind}-{group.split('.')[0]}-{version['name']}".lower()
                with open(os.path.join(out_dir, name + ".json"), "w", encoding="utf-8") as f:
                    json.dump(schema, f, indent=1, sort_keys=True)
                written += 1
    if not written:
        sys.exit(f"crd_schema.py: no CustomResourceDefinition in {' '.join(files)}")


if __name__ == "__main__":
    main()
