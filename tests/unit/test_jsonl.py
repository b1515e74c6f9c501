"""JSONL lines break only at line endings, not at U+2028 & co. inside JSON strings."""
import json

from tritongen.jsonl import read_lines


def test_separators_inside_json_strings_do_not_split_lines(tmp_path):
    rows = [{"prompt": "a\u2028b"}, {"prompt": "c\u2029d\x85e"}, {"prompt": "plain"}]
    path = tmp_path / "x.jsonl"
    path.write_text("\r\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n", encoding="utf-8")
    assert [json.loads(line) for line in read_lines(path)] == rows
    assert len(path.read_text(encoding="utf-8").splitlines()) > len(rows)  # what the old reader did
