"""What the model is: config.json read (hfconfig, modelspec), its quantization, the hub, tool-call
and chat-template knowledge, and the embedded tiny model.
"""
