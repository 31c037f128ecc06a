# Validates tokenwatch.yaml documents against the published JSON Schema with the reference
# `jsonschema` package (draft 2020-12); prints {file: [error, ...]} as JSON, one entry per file.
import json
import sys

import jsonschema
import yaml

schema = json.load(open(sys.argv[1]))
jsonschema.Draft202012Validator.check_schema(schema)
validator = jsonschema.Draft202012Validator(schema)
result = {}
for path in sys.argv[2:]:
    doc = yaml.safe_load(open(path)) or {}
    result[path] = [
        "/".join(str(p) for p in e.absolute_path) + ": " + e.message
        for e in validator.iter_errors(doc)
    ]
print(json.dumps(result))
