"""TTS service: streaming speech synthesis on OpenBMB VoxCPM2, patch by patch (160 ms), with text-in streaming.

Rooms: config (settings, presets/), servicer (gRPC ↔ internal types), backend (the engine contract),
backends/voxcpm (worker processes running VoxCPM2), pool (worker leasing and the bounded queue),
phrases (cutting streamed text), audio (resampling, encoding), metrics, benchmark.
"""
