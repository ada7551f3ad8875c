"""The requests the official function-calling handler builds for single-turn entries: run
with the interpreter of the official pipeline's own environment (``.venv-bfcl``: bfcl-eval
with all its pins), it reads a JSON list of categories on stdin and writes, per entry id,
``{"tools": …, "messages": …}`` as ``OpenAICompletionsHandler`` would send them (the language
hints added, the tools converted for OpenAI-compatible endpoints). Test equipment: it
imports only the standard library and bfcl_eval, so it runs outside this project's
environment. Used by tests/eval/test_bfcl_single.py to hold :mod:`eval.bfcl.single` to it.
"""

import json
import sys


def main() -> None:
    from bfcl_eval.constants.enums import ModelStyle
    from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI
    from bfcl_eval.model_handler.utils import convert_to_tool
    from bfcl_eval.utils import load_dataset_entry

    out = {}
    for category in json.load(sys.stdin):
        entries = load_dataset_entry(
            category, include_prereq=False, include_language_specific_hint=True
        )
        for e in entries:
            tools = convert_to_tool(
                e["function"], GORILLA_TO_OPENAPI, ModelStyle.OPENAI_COMPLETIONS
            )
            out[e["id"]] = {"tools": tools, "messages": e["question"][0]}
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
