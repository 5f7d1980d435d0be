"""SpeakER: synthesis and filtering of clarification dialogues (SpeakRL section 3.4)."""
