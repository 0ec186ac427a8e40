"""The run configuration: typed sections, validated from YAML with errors that name the file, field and value."""

from convalue.engine.config.sections import *  # noqa: F403
from convalue.engine.config.sections import (  # noqa: F401
    BUILTIN_EMBEDDINGS,
    BUILTIN_MODELS,
    ConfigError,
    RunConfig,
    config_from_dict,
    load_config,
    reference_markdown,
)
