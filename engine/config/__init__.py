"""The run configuration: typed sections, validated from YAML with errors that name the file, field and value."""

from convalue.engine.config.analysis import FaithfulnessConfig, TransferConfig
from convalue.engine.config.baselines import DataModelConfig, DeepSpeedConfig, GradExConfig
from convalue.engine.config.fields import ConfigError
from convalue.engine.config.inputs import (
    BUILTIN_EMBEDDINGS,
    BUILTIN_MODELS,
    DataConfig,
    FeaturesConfig,
    LoraConfig,
    ModelConfig,
    ProjectionConfig,
    SourceConfig,
)
from convalue.engine.config.parsing import config_from_dict, load_config
from convalue.engine.config.reference import reference_markdown
from convalue.engine.config.run import RunConfig
from convalue.engine.config.settings import (
    BootstrapConfig,
    FinetuneConfig,
    RayConfig,
    SelectConfig,
)
from convalue.engine.config.solver import SolverConfig

__all__ = [
    "BUILTIN_EMBEDDINGS",
    "BUILTIN_MODELS",
    "BootstrapConfig",
    "DataModelConfig",
    "ConfigError",
    "DataConfig",
    "FeaturesConfig",
    "DeepSpeedConfig",
    "FaithfulnessConfig",
    "FinetuneConfig",
    "GradExConfig",
    "LoraConfig",
    "ModelConfig",
    "ProjectionConfig",
    "RayConfig",
    "RunConfig",
    "SelectConfig",
    "SolverConfig",
    "SourceConfig",
    "TransferConfig",
    "config_from_dict",
    "load_config",
    "reference_markdown",
]
