"""The DDP comm hook: raw, bf16, int8 + error feedback, int4 + error feedback and auto, replicas
bit-identical, residuals across DDP's bucket rebuild and through state_dict()."""


def test_hook_codecs_match_ddp_and_replicas_are_identical(ranks):
    out = ranks(2, "hooks", timeout=180).check()
    res = out.results[0]
    assert res["raw"]["max_rel_error"] < 1e-6
    assert res["int8"]["compression"] > 2.5, res["int8"]
    assert res["int4"]["compression"] > res["int8"]["compression"]


def test_residual_follows_parameters_across_the_bucket_rebuild(ranks):
    ranks(2, "residual_follows_parameters", timeout=120).check()


def test_auto_codec_hook(ranks):
    ranks(2, "auto_hook", timeout=120).check()
