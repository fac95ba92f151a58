"""Why a service is as fast as it is: regime verdicts per concurrency level, the knee, roofline predictions
from first principles against the measured ceilings, and the capacity plan built on recorded sweeps.

The sweep runner calls `analyse(facts, levels, target)` and embeds `render_markdown(analysis)` in its report;
`analysis.roofline` holds the data for the roofline plot (ceiling line, predicted and measured points).
"""

from loadgen.analysis.predict import Prediction
from loadgen.analysis.render import render_markdown
from loadgen.analysis.sweep_analysis import analyse
from loadgen.analysis.verdicts import LevelVerdict, SweepAnalysis

__all__ = ["LevelVerdict", "Prediction", "SweepAnalysis", "analyse", "render_markdown"]
