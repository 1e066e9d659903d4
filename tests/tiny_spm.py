"""English-German sentence pairs written here, for tiny SentencePiece
models and a tiny Marian checkpoint (`marian_fixture.save_tiny_marian`)
that tests build on every backend without the Multi30k data."""

PAIRS = [
    ("A man rides a bicycle down the street.", "Ein Mann fährt mit dem Fahrrad die Straße hinunter."),
    ("Two dogs are playing in the snow.", "Zwei Hunde spielen im Schnee."),
    ("A little girl is climbing the stairs.", "Ein kleines Mädchen klettert die Treppe hinauf."),
    ("An older woman sits on a bench.", "Eine ältere Frau sitzt auf einer Bank."),
    ("A boy is jumping into the water.", "Ein Junge springt ins Wasser."),
    ("Three people are walking on the beach.", "Drei Menschen gehen am Strand spazieren."),
    ("A woman is reading a book in the park.", "Eine Frau liest ein Buch im Park."),
    ("The children are eating ice cream.", "Die Kinder essen Eis."),
    ("A black dog runs through the grass.", "Ein schwarzer Hund läuft durch das Gras."),
    ("Two men are talking at a table.", "Zwei Männer unterhalten sich an einem Tisch."),
    ("A man in a red shirt is cooking.", "Ein Mann in einem roten Hemd kocht."),
    ("A woman plays the guitar on stage.", "Eine Frau spielt auf der Bühne Gitarre."),
    ("The girl is holding a white cat.", "Das Mädchen hält eine weiße Katze."),
    ("A group of friends is sitting outside.", "Eine Gruppe von Freunden sitzt draußen."),
    ("A young man is skateboarding in the city.", "Ein junger Mann fährt in der Stadt Skateboard."),
    ("The old man is fishing by the lake.", "Der alte Mann angelt am See."),
    ("Two girls are dancing in a room.", "Zwei Mädchen tanzen in einem Zimmer."),
    ("A worker is painting a wall.", "Ein Arbeiter streicht eine Wand."),
    ("A child is sleeping on the sofa.", "Ein Kind schläft auf dem Sofa."),
    ("A brown horse stands in a field.", "Ein braunes Pferd steht auf einem Feld."),
    ("The woman is carrying a large bag.", "Die Frau trägt eine große Tasche."),
    ("A man is climbing a mountain.", "Ein Mann klettert auf einen Berg."),
    ("Children play football in the street.", "Kinder spielen auf der Straße Fußball."),
    ("A woman in a blue dress is smiling.", "Eine Frau in einem blauen Kleid lächelt."),
    ("Two boys are swimming in the pool.", "Zwei Jungen schwimmen im Becken."),
    ("A cook prepares food in the kitchen.", "Ein Koch bereitet in der Küche Essen zu."),
    ("The dog is catching a ball.", "Der Hund fängt einen Ball."),
    ("A man sells fruit at the market.", "Ein Mann verkauft Obst auf dem Markt."),
    ("People are waiting for the bus.", "Menschen warten auf den Bus."),
    ("A girl rides a horse on the beach.", "Ein Mädchen reitet am Strand auf einem Pferd."),
    ("An old woman is knitting a scarf.", "Eine alte Frau strickt einen Schal."),
    ("A man is drinking coffee in a cafe.", "Ein Mann trinkt in einem Café Kaffee."),
    ("Two women are walking with a dog.", "Zwei Frauen gehen mit einem Hund spazieren."),
    ("A baby is laughing with his mother.", "Ein Baby lacht mit seiner Mutter."),
    ("The men are building a house.", "Die Männer bauen ein Haus."),
    ("A boy throws a stone into the river.", "Ein Junge wirft einen Stein in den Fluss."),
    ("A woman is taking a photo of the city.", "Eine Frau macht ein Foto von der Stadt."),
    ("A young girl is singing a song.", "Ein junges Mädchen singt ein Lied."),
    ("The cyclists are racing on the road.", "Die Radfahrer fahren auf der Straße ein Rennen."),
    ("A man and a woman are dancing.", "Ein Mann und eine Frau tanzen."),
    ("A dog is sleeping in the sun.", "Ein Hund schläft in der Sonne."),
    ("Two children are reading in the library.", "Zwei Kinder lesen in der Bibliothek."),
    ("A man is playing the piano.", "Ein Mann spielt Klavier."),
    ("The girls are running in the park.", "Die Mädchen laufen im Park."),
    ("A woman is washing the dishes.", "Eine Frau spült das Geschirr."),
    ("A small boy is eating an apple.", "Ein kleiner Junge isst einen Apfel."),
    ("A police officer stands on the corner.", "Ein Polizist steht an der Ecke."),
    ("Three dogs are running on the beach.", "Drei Hunde rennen am Strand."),
]

SOURCES = [source for source, _ in PAIRS]
TARGETS = [target for _, target in PAIRS]

# Texts that are not among the pairs: the tests translate these (the
# fixture raises `</s>`'s logits bias until greedy decoding ends some of
# them and not others within its budget).
TEXTS = [
    "A man rides a horse down the street.",
    ">>de<< Two girls are playing in the snow!",
    "Hi",
    "A little boy in a red shirt is climbing the stairs of a wooden house.",
    "People.",
    "An older man sits on a bench, reading.",
]


def with_zero_padding_embedding(directory, output_directory):
    """A copy of the Marian checkpoint in `directory`, written to
    `output_directory`, whose `<pad>` embedding row is zero, as in
    opus-mt's checkpoints (transformers' converter appends `<pad>` to
    Marian's vocabulary as a row of zeros). The random model of
    `marian_fixture.save_tiny_marian` has a non-zero row there, which
    `convert.export_marian` writes as zeros (Marian decoders start from a
    zero vector): its `<pad>` logit, part of every log-softmax, then
    changes, and so may beam search's choices. Returns
    `output_directory`."""
    import shutil

    import torch
    from transformers import MarianMTModel

    shutil.copytree(directory, output_directory, dirs_exist_ok=True)
    model = MarianMTModel.from_pretrained(directory).eval()
    with torch.no_grad():
        for embeddings in {id(e): e for e in (model.get_input_embeddings(), model.get_output_embeddings())}.values():
            embeddings.weight[model.config.pad_token_id] = 0.0
    model.save_pretrained(output_directory)
    return output_directory
