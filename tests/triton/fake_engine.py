"""AsyncLLM.open() for the tests' scripted engines, over their generate(): a task hands each output
(or the exception ending the stream) to on_item, as AsyncLLM's step callback does."""
import asyncio


class GeneratedStream:
    def __init__(self, task):
        self.task = task

    def close(self):
        self.task.cancel()


class OpenOverGenerate:
    def open(self, prompt, params, request_id, on_item):
        async def feed():
            try:
                async for out in self.generate(prompt, params, request_id):
                    on_item(out)
            except Exception as exc:
                on_item(exc)
        return GeneratedStream(asyncio.ensure_future(feed()))
