"""Load generator: Locust sweeps over the ASR, LLM and TTS services (and a whole voice turn), with a verdict per
concurrency level of *why* the service is as fast as it is, judged against the device ceilings it measured."""
