"""ColossalAI backend (runs in .venvs/colossal, see scripts/setup-env-colossal.sh)."""

from pathlib import Path

from llmpipe.backends import Backend


def _checks(cfg: dict) -> list[str]:
    from llmpipe.backends.colossal.checks import problems

    return problems(cfg)


def _parallel_defaults(cfg: dict) -> dict:
    from llmpipe.backends.colossal.checks import parallel_defaults

    return parallel_defaults(cfg)


def _resume_sections(cfg: dict) -> dict:
    from llmpipe.backends.colossal.checks import resume_sections

    return resume_sections(cfg)


BACKEND = Backend(
    process_per_gpu=True,
    name="colossal",
    doc="ColossalAI Booster (Gemini, ZeRO, 3D) on GPUs, in its own environment",
    commands={"colossal-train": "llmpipe.backends.colossal.train"},
    env="envs/colossal.yaml",
    setup="scripts/setup-env-colossal.sh",
    env_requires=(
        "colossalai==0.5.0",
        "transformers==4.51.3",
        "tokenizers==0.21.4",
        "datasets==4.4.1",
        "torch",
    ),  # as envs/ and scripts/setup-env-colossal.sh pin them
    section_schema=Path(__file__).with_name("schema.yaml"),
    checks=_checks,
    parallel_defaults=_parallel_defaults,
    resume_sections=_resume_sections,
)
