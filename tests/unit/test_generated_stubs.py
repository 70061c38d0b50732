from rlfleet.wire import codegen


def test_generated_stubs_match_protos():
    stale = codegen.stale_files()
    assert stale == [], f"regenerate with `make proto`: {stale}"
