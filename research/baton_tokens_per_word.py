"""How many Llama-2 tokens does an English word take? Baton (Cong et al., 2024) gives its query lengths
in words; `simctl.studies.query_set` needs tokens. Counts words (whitespace-separated) and Llama-2 tokens
(no BOS) of English texts with llama-tokenizer-js (npm, the LLaMA 1/2 SentencePiece vocabulary; Python has no
offline copy of that tokenizer here), run by node.

    npm install --prefix /tmp/lltok llama-tokenizer-js@1.2.2
    python research/baton_tokens_per_word.py /tmp/lltok/node_modules/llama-tokenizer-js/llama-tokenizer.js \\
        /usr/share/common-licenses/GPL-3 /usr/share/common-licenses/GFDL-1.3 ../shared/seeds/003_*.txt ...

A seed paper's text is cut to its prose paragraphs (lines over 300 characters without LaTeX residue), into a
temporary file. Results: research/results/baton_tokens_per_word.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

COUNT_JS = """
import tok from %s;
import fs from 'fs';
const out = {};
for (const f of process.argv.slice(2)) {
  const text = fs.readFileSync(f, 'utf8');
  out[f] = [text.split(/\\s+/).filter(w => w.length).length, tok.encode(text, false, false).length];
}
console.log(JSON.stringify(out));
"""


def prose(path: Path, folder: Path) -> Path:
    """`path` itself, or for a seed paper (under seeds/) its prose paragraphs in `folder`."""
    if path.parent.name != "seeds":
        return path
    lines = [s for s in path.read_text(encoding="utf-8").splitlines()
             if len(s) > 300 and "italic_" not in s and "POSTSUBSCRIPT" not in s and "\\" not in s]
    kept = folder / path.name
    kept.write_text("\n".join(lines), encoding="utf-8")
    return kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tokenizer_js", type=Path, help="llama-tokenizer.js of the npm package")
    parser.add_argument("texts", type=Path, nargs="+")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        script = folder / "count.mjs"
        script.write_text(COUNT_JS % json.dumps(str(args.tokenizer_js.resolve())), encoding="utf-8")
        files = {str(prose(p, folder)): p.name for p in args.texts}
        counts = json.loads(subprocess.run(["node", str(script), *files], capture_output=True, text=True,
                                           check=True).stdout)
    print("| text | words | Llama-2 tokens | tokens a word |\n|---|---:|---:|---:|")
    for f, (words, tokens) in counts.items():
        print(f"| {files[f]} | {words} | {tokens} | {tokens / words:.2f} |")


if __name__ == "__main__":
    main()
