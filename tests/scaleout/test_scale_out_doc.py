"""docs/scale-out.md's table section is generated from connector/placement.py (issue 23): the committed document
must equal what scripts/scale_out_doc.py renders, so the document and the routability test read the same data."""
from __future__ import annotations

from scripts import scale_out_doc


def test_the_committed_table_section_is_the_generated_one():
    """Run `python scripts/scale_out_doc.py` after changing connector/placement.py."""
    committed = scale_out_doc.DOC.read_text()
    assert scale_out_doc.rewrite(committed) == committed, "stale: run python scripts/scale_out_doc.py"


def test_every_table_and_every_listed_statement_is_in_the_document():
    from connector import placement

    section = scale_out_doc.render()
    for table in list(placement.DEFAULT) + list(placement.JOURNAL_TABLES):
        assert f"| `{table}` |" in section, table
    for step, table, problem in {**placement.KNOWN_UNROUTABLE, **placement.SINGLE_NODE_ONLY}:
        assert f"| {step} | `{table}` | {problem} |" in section, (step, table)
