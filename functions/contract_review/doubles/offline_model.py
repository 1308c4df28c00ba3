"""`OfflineRuleModel`: a deterministic, rule-based analyst model. Not an LLM.

It answers the same requests a Bedrock model gets (it reads the request's structured payload
rather than the prose prompt) with keyword/regex rules per category, so the whole pipeline runs
offline and its findings are reproducible. Recall against CUAD is measured by
`tests/unit/doubles/test_offline_model_cuad.py`.

How `locate` works:
1. the chunk is split into sentence units (blank lines, and sentence ends that are not
   abbreviations such as "Inc." or "U.S." or section numbers such as "14.1");
   A heading ("4. Limitation of Liability.") is prefixed to the clause after it, never a unit
   of its own; table-of-contents lines and bare cross-reference definitions are dropped;
2. each unit is tested against the category's rules (`PATTERNS`). A rule is a regex, or a tuple
   of regexes that must all match, where a regex prefixed with "!" must NOT match inside the
   text that would be quoted. A literal space in a rule matches any run of whitespace;
3. the quote is the unit itself, or, for a long unit (over 600 chars), only the ";"/":"/"(a)"
   separated parts of it that hold the match (a window around the match if there are none).
   Every quote is an exact slice of the chunk text.

Rules are written for legal drafting in general (not for particular contracts); their recall per
mapped CUAD category is measured on the 33 CUAD contracts in ../shared/data/cuad, which were
also used to develop them, so treat those numbers as in-sample.
"""

from __future__ import annotations

import functools
import json
import re

from contract_review.config.constants import OFFLINE_MODEL_ID
from contract_review.domain.model import ModelRequest, ModelResponse, text_tokens
from contract_review.doubles.bedrock_sim import SimulatedPromptCache

# A rule is a regex string, or a tuple of regex strings that must all match ("!" = must not match).
Rule = str | tuple[str, ...]

# Small building blocks shared by several rules.
_NUM = (r"(?:\d[\d,.]*|(?:one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|fourteen|fifteen|"
        r"sixteen|seventeen|eighteen|nineteen|twenty|thirty|forty|fifty|sixty|seventy|eighty|ninety|hundred)"
        r"(?:[ -](?:one|two|three|four|five|six|seven|eight|nine|hundred|and))*)\b")
_PERIOD = rf"{_NUM}[\s-]*(?:\(\d+\)[\s-]*)?(?:calendar\s+|business\s+|working\s+)?(?:days?|weeks?|months?|years?)['’]?"
_NOTICE = rf"(?:{_PERIOD}\s*(?:(?:prior|advance|previous|written)\s+)*notice|notice\b.{{0,40}}\b(?:of\s+|at\s+least\s+|not\s+less\s+than\s+|no\s+less\s+than\s+)?{_PERIOD})"
_FOR_CAUSE = (r"!\b(?:breach\w*|default\w*|insolven\w*|bankrupt\w*|fails?\b|failure|cure[sd]?\b|force majeure|violat\w*"
              r"|receivership|liquidat\w*|winding.up|dissol\w*|misconduct|convicted|fraud)")
_MONEYISH = r"(?:\$|dollars|euros?|€|£|percent|%|units?|barrels|kw|mw|hours|orders?|\[\*+\]|\*{3,}|\d)"

PATTERNS: dict[str, tuple[Rule, ...]] = {
    "liability_cap": (
        r"\bin no (?:event|case|circumstances?)\b.{0,400}\bliab(?:le|ility)",
        r"\bliab(?:le|ility)\b.{0,200}\bin no (?:event|case)\b",
        r"\blimitations? (?:of|on) (?:liability|damages|remedies)\b",
        r"\b(?:total|aggregate|cumulative|maximum|entire|overall|collective)\s+(?:\w+\s+){0,4}liabilit(?:y|ies)\b",
        r"\bliabilit(?:y|ies)\b.{0,300}\b(?:shall|will|may|does|to) not\b.{0,30}\bexceed",
        r"\bliabilit(?:y|ies)\b.{0,200}\b(?:limited to|capped at|not to exceed|in excess of)\b",
        r"\b(?:shall|will|may) not be (?:held )?(?:liable|responsible)\b.{0,250}\b(?:damages|loss|losses|profits|costs)\b",
        r"\b(?:not|in no event) be liable\b.{0,300}\b(?:indirect|consequential|special|incidental|punitive|exemplary|lost profits|loss of profits)",
        r"\b(?:consequential|incidental|indirect|special|punitive|exemplary|multiple|treble)\b[\w\s,/-]{0,80}?\bdamages\b",
        r"\bsole (?:and exclusive )?(?:remedy|remedies|obligation|liability|warranty)\b",
        r"\b(?:shall|will) in no event exceed\b|\bin no event shall\b.{0,150}\bexceed\b",
        r"\bexclusive remed(?:y|ies)\b",
        r"\b(?:limited|restricted) to (?:actual|direct|the (?:amount|fees|price)|refund|repair|replacement)",
        r"\bwaives?\b.{0,150}\b(?:damages|claims? for)\b",
        r"\b(?:no right|no rights|not be entitled) to (?:any )?(?:damages|compensation|indemnification)",
        r"\b(?:not be required to contribute|required to contribute any amount in excess)\b",
        r"\bno (?:action|claim|suit)\b.{0,150}\bmay be (?:brought|commenced|asserted)\b.{0,150}\b(?:after|more than)\b",
        (r"\bliabilit(?:y|ies)\b", r"\b(?:shall|will) (?:in no event |not )?(?:exceed|be limited)\b"),
    ),
    "uncapped_liability": (
        r"\bunlimited liability\b",
        r"\bwithout limitation as to amount\b",
        r"\b(?:shall|will) not be (?:subject to|limited by|counted toward)\b.{0,120}\b(?:limitation|cap|maximum|limit)",
        r"\b(?:limitations?|exclusions?|caps?|maximum liability|limits?)\b.{0,250}\b(?:shall|will|do|does) not apply\b",
        (r"\b(?:shall|will|do|does) not (?:apply to|limit)\b.{0,250}\b(?:indemnif\w*|breach|gross negligence|wil(?:l)?ful|fraud|confidential\w*|infringe\w*|death|bodily injury|personal injury)",
         r"\b(?:limitations?|caps?|exclusions?|liab\w*|damages)\b"),
        r"\bnot be (?:limited|capped)\b.{0,100}\b(?:liab|damages)",
        (r"\b(?:except|excluding|other than|excepting|save)\b(?:\s+(?:for|with respect to|with regard to|in the (?:event|case) of|as to|to the extent of))?.{0,400}"
         r"\b(?:indemnif\w*|gross(?:ly)? negligen\w*|wil(?:l)?ful|intentional|fraud\w*|confidential\w*|infring\w*|misappropriat\w*|section \d+|article \d+|death|bodily injury|third.party claim)",
         r"\b(?:liab(?:le|ility)|damages)\b",
         r"\b(?:in no event|not be liable|exceed\w*|limit\w*|no liability|consequential|indirect|cap\b|maximum)"),
        (r"\b(?:foregoing|above|preceding|this (?:section|article)|such|these) (?:\w+ ){0,4}(?:limitations?|exclusions?|disclaimers?|caps?|waivers?)?\b.{0,40}\b(?:shall|will|does|do) not (?:be construed (?:to|as) |be deemed (?:to|as) |operate to )?(?:limit|apply|restrict|reduce|exclude)\w*\b",
         r"\b(?:liab\w*|damages|indemn\w*)\b"),
    ),
    "indemnification": (r"\bindemnif", r"\bhold\b.{0,60}\bharmless\b", r"\bdefend\b.{0,300}\bagainst\b"),
    "termination": (
        (r"\bterminat\w*\b.{0,250}\b(?:for (?:its )?convenience|without (?:any )?cause|for any reason|for no reason|any reason or no reason|with or without cause|at any time|in its (?:sole |absolute )*discretion|without (?:any )?(?:liability|penalty))",
         r"!\b(?:may not|shall not|cannot|not be entitled to) terminat\w*|\bsurviv\w*|\bmutual (?:written )?(?:consent|agreement)|\bby (?:mutual )?agreement in writing",
         _FOR_CAUSE),
        r"\b(?:for (?:its )?convenience|without (?:any )?cause|for any reason|with or without cause)\b.{0,150}\bterminat",
        (r"\bterminat\w*\b", r"\b(?:may|can|shall have the (?:right|option|ability)|will have the (?:right|option|ability)|entitled|either (?:party|of)|any party|until|right to)\b", r"\bnotice\b", rf"{_NOTICE}", _FOR_CAUSE),
        (r"\bnotice\b.{0,120}\b(?:decision|intent\w*|election|desire|wish) to terminate\b", _FOR_CAUSE),
        (r"\b(?:discontinue|withdraw|cancel)\w*\b.{0,200}\b(?:at any time|upon|on)\b.{0,60}\bnotice\b", _FOR_CAUSE),
    ),
    "renewal": (
        r"\b(?:automatic(?:ally)?|successive|additional|further|subsequent|consecutive)\b.{0,120}\b(?:renew\w*|extend\w*|extension|continue\w*)",
        r"\b(?:renew\w*|extend\w*|extension|continue\w*)\b.{0,120}\b(?:automatic(?:ally)?|successive|additional|further|consecutive)\b.{0,60}\b(?:terms?|periods?|years?|months?|one.year)",
        r"\brenew\w*\b.{0,150}\b(?:terms?|periods?|years?|months?|basis|expir\w*)\b",
        r"\b(?:non-?renewal|not (?:to )?(?:renew|extend)|intention not to|elect(?:s|ion)? not to (?:renew|extend)|decline to renew)\b",
        r"\bunless\b.{0,200}\b(?:notice|notif\w*|terminat\w*)\b.{0,250}\b(?:prior to|before|in advance of|preceding)\b.{0,80}\b(?:expiration|end|expiry|anniversary|termination)\b",
        r"\b(?:continue|remain)\b.{0,150}\b(?:thereafter|in (?:full )?(?:force|effect))\b.{0,150}\buntil (?:terminated|either|one|a party|the (?:company|parties))",
        r"\b(?:year.to.year|month.to.month|from year to year|evergreen)\b",
        r"\bextend the term\b",
        r"\binitial term\b",
        r"\bterm of this agreement\b.{0,200}\b(?:shall|will) (?:commence|begin|continue|expire|end|remain)\b",
    ),
    "restrictive_covenants": (
        r"\bnon-?compet\w*",
        r"\b(?:not|no|refrain\w*|neither|nor)\b.{0,200}\bcompet(?:e|es|ing|itive|ition)\b",
        r"\b(?:not|no|refrain\w*|neither|nor)\b.{0,250}\b(?:sell|provide|supply|license|market|distribute|work|render)\w*\b.{0,120}\bcompetitors?\b",
        r"\bcompet(?:e|ing|itive|itor|itors)\b.{0,200}\b(?:shall not|will not|may not|agrees not|prohibit\w*|restrict\w*)\b",
        r"(?<!non-)(?<!non-\s)(?<!not\s)(?<!and\s)(?<!sole\s)(?<!used\s)\bexclusiv\w*\b(?! (?:remed\w*|jurisdiction|venue|forum|courts?|of\b|benefit|warranty|authority|procedures?|statement|agreement|property|holder|owner\w*|place|control|by the laws|in that state)|ly (?:by|liable|responsible|owned|in)\b)",
        r"(?<!for\s)\b(?:solicit\w*|recruit\w*|hire|employ)\b.{0,100}\b(?:employees?|personnel|staff|consultants?|contractors?)\b",
        r"\bsolicit\w*\b.{0,100}\b(?:customers?|clients?|policyholders?|accounts|suppliers?)\b",
        r"\b(?:not|no|refrain\w*)\b.{0,120}\b(?:solicit\w*|entice\w*|divert\w*)",
        r"\binduce\w*\b.{0,120}\bto (?:leave|terminate|cease|end|reduce)\b",
        r"\b(?:shall|will|may|agrees?) not\b.{0,200}\b(?:engage|participate|invest|own|manage|operate|be (?:employed|engaged|interested))\b.{0,200}\b(?:business|project|enterprise|venture|activit\w*|similar|substantially similar)",
        r"\b(?:sole|only|exclusive) (?:supplier|source|provider|distributor|reseller|licensee|agent|representative|vendor|manufacturer)\b",
        r"\ball (?:of )?(?:its|their|the) (?:requirements|needs)\b",
        r"\b(?:shall|will|may|agrees?(?: to)?) not\b.{0,80}\b(?:purchase|buy|source|procure|obtain|sell|distribute|market|resell|license)\b.{0,200}\b(?:from any (?:person|party|entity|third|other)|other than|any (?:third party|other (?:supplier|manufacturer|source|distributor|person|party)))",
        r"\b(?:shall|will|may|agrees?(?: to)?) (?:\(\w{1,3}\) )?not\b.{0,40}\b(?:enter into|contract|deal|partner|collaborate|cooperate|work)\b.{0,200}\b(?:third part\w*|any other|similar|competitor|any (?:media|other) \w+)",
        r"\b(?:non-?disparage\w*|disparage\w*)\b",
    ),
    "assignment": (
        (r"\bassign(?:ed|ment|ments|able|ability|ee|ees|or)?\b|(?<!and\s)(?<!or\s)(?<!permitted\s)\bassigns\b",
         r"!\bhereby (?:irrevocably )?assigns?\b|\bassigns? (?:and transfers? )?(?:to \w+ )?all (?:of its )?(?:right|rights|title)|\b(?:employees?|personnel|staff|individuals?) assigned\b|\bassigned to (?:him|her|it|them|such \w+|the project)\b|\bmeaning assigned\b|\bassigned (?:such |the )?meaning"
         r"|\bassignment for the benefit of (?:its )?creditors\b|\b(?:his|her|their) assignment\b"
         r"|\b(?:not |to )?assign (?:anyone|any (?:individual|person|employee)|(?:supplier |its )?personnel|staff)\b"),
        r"\b(?:may not|shall not|will not|cannot|can not|not be|nor)\b.{0,120}\b(?:transfer\w*|delegat\w*|subcontract\w*|convey\w*|sublet|pledge|encumber)\b",
        r"\bnot\b.{0,120}\b(?:transfer\w*|convey\w*|sell|dispose)\b.{0,200}\b(?:without|unless)\b.{0,60}\b(?:consent|approval)\b",
        r"\b(?:transfer\w*|delegat\w*|subcontract\w*|convey\w*|transaction)\b.{0,250}\b(?:null and void|void ab initio|shall be void|is void|of no (?:force|effect))",
        r"\bchange (?:of|in) (?:control|ownership)\b",
        r"\b(?:acquired by|acquisition of|is acquired|be acquired|merge[sd]? with|merger|consolidat\w* (?:with|into)|reorgani[sz]ation)\b.{0,250}\b(?:assign\w*|terminat\w*|consent|control|successor|notice|deemed|entitled|provision)",
        r"\b(?:sale|transfer|disposition)\b.{0,20}\b(?:of )?(?:all or )?(?:substantially all|a majority|more than (?:fifty|50)|(?:fifty|50) percent|control)\b",
        r"\b(?:shareholders?|equity|ownership) (?:or equity )?(?:structure )?(?:changes?|is changed)\b",
        r"\bceases? to (?:manage|control|be (?:controlled|owned|an affiliate))\b",
        r"\b(?:ownership or control|control or ownership|controlling (?:interest|shareholder))\b",
        r"\bvoting (?:stock|securities|power|shares|equity)\b.{0,150}\b(?:acquir\w*|transfer\w*|sold|sale|own\w*)",
    ),
    "ip_ownership": (
        r"\bhereby (?:irrevocably )?(?:assigns?|transfers?|conveys?)\b",
        r"\b(?:agrees? to|shall|will|must) (?:promptly )?(?:assign|transfer|convey)\b.{0,200}\b(?:right|title|interest|invention|patent|copyright|intellectual|ownership|share)",
        r"\bassigns?\b.{0,60}\ball (?:of )?(?:its |their |the )?(?:right|rights)\b",
        r"\b(?:sole|exclusive|absolute) (?:and exclusive )?(?:owner\w*|property|holder)\b",
        r"\b(?:owned|held) (?:solely|exclusively|jointly|wholly) by\b",
        r"\b(?:shall|will) (?:at all times )?(?:be|remain) (?:solely |exclusively |jointly |wholly )?owned\b",
        r"\b(?:shall|will) (?:solely |exclusively |jointly )?(?:own|vest in|belong to|be the (?:sole )?property|remain the (?:sole |exclusive )?property)",
        r"\b(?:title|ownership)\b.{0,80}\b(?:shall|will) (?:vest|remain|belong|pass)",
        r"\b(?:joint(?:ly)?|co-?)[ -]?(?:own\w*|owner\w*|invent\w*|register\w*|hold\w*|property|names|developed|inventors?)\b",
        r"\bco-?ownership\b",
        r"\bin (?:the )?(?:joint )?names? of\b.{0,60}\band\b",
        r"\bwork(?:s)? (?:made )?for hire\b",
        r"\btransfer\b.{0,60}\b(?:ownership|title)\b",
        r"\bintellectual property\b.{0,200}\b(?:own\w*|vest\w*|belong\w*|assign\w*|retain\w*|property of)\b",
        r"\b(?:own|owns|ownership|vest\w*|belong\w*|retains?)\b.{0,200}\b(?:intellectual property|inventions?|improvements?|work product|deliverables|developments?|derivative works?|patents?|copyrights?|know-how)\b",
        r"\bright, title and interest\b",
    ),
    "license_grant": (
        r"\bgrant\w*\b.{0,300}\b(?:licen[cs]e|sublicen[cs]e|right to (?:use|reproduce|distribute|market|sell|display|copy|modify|access|make|practice))",
        r"\b(?:is|are|be|been) (?:hereby |hereunder |also )?licen[cs]ed\b",
        r"\blicen[cs]ed (?:back )?to\b",
        r"\b(?:shall|will|to) have (?:a|an|the)\b.{0,150}\blicen[cs]e\b",
        r"\b(?:non-?exclusive|exclusive|limited|royalty[- ]free|worldwide|world-wide|perpetual|irrevocable|fully[- ]paid(?:[- ]up)?|paid[- ]up|revocable|personal)\b.{0,150}\b(?:licen[cs]e|right to use|right and license)\b",
        r"\blicen[cs]e\b.{0,150}\b(?:non-?transferable|non-?assignable|perpetual|irrevocable|royalty[- ]free|worldwide|non-?exclusive|non-?sublicensable)\b",
        r"\bright (?:and license )?to (?:use|reproduce|display|distribute)\b",
        r"\b(?:exclusive|non-?exclusive|worldwide|world-wide)\b.{0,60}\brights? (?:to|in)\b",
        r"\b(?:shall|will|agrees? to|hereby) (?:license|licence|sublicense)s?\b",
        r"\bauthori[sz]es?\b.{0,150}\b(?:to|and) (?:use|display|reproduce|distribute|market|sell)\b",
        r"\bsub-?licens\w*",
        r"\bnon-?transferable\b",
        r"\bnot (?:be )?(?:transferable|assignable|sublicensable)\b",
        r"\bconveys?\b.{0,100}\b(?:no )?right\b",
        r"\b(?:perpetual|irrevocabl\w*)\b.{0,150}\b(?:right|licen[cs]e|use)",
        r"\bappoint\w*\b.{0,100}\bas\b.{0,60}\b(?:distributor|reseller|dealer|licensee|sales (?:agent|representative))\b",
        r"\blicen[cs]e (?:agreement|terms|rights?) (?:to|for|in)\b",
    ),
    "governing_law": (
        r"\bgovern(?:ed|s)?\b.{0,120}\blaws?\b",
        r"\bgoverning law\b",
        (r"\blaws? of (?:the )?(?:state|commonwealth|province|republic|kingdom|people's republic|federal republic|united states|england|new york|delaware|california|texas)\b",
         r"!\b(?:organi[sz]ed|incorporated|existing|formed|registered|chartered)\b(?: and existing)? under the laws\b"),
        r"\b(?:construed|interpreted|enforced|determined)\b.{0,120}\b(?:in accordance with|under|pursuant to)\b.{0,40}\blaws?\b",
        r"\b(?:exclusive|non-?exclusive) jurisdiction\b",
        r"\b(?:submit\w*|consent\w*|irrevocably \w+)\b.{0,60}\bjurisdiction\b",
        r"\bjurisdiction of (?:the )?(?:state |federal )?courts?\b",
        r"\bvenue\b",
        r"\barbitrat\w+",
        r"\bdisputes?\b.{0,150}\b(?:resolved|settled|submitted|referred)\b",
        r"\bconflicts? of laws?\b",
    ),
    "audit_rights": (
        (r"\baudit\w*", r"!\baudited (?:financial|consolidated|balance)"
                          r"|\b(?:employees|contractors|accountants|attorneys|lawyers|advisers|advisors|counsel),? (?:and |or )?(?:its |their )?auditors\b"
                          r"|\bauditors,? (?:and |or )?(?:professional |legal |financial )?(?:advis|counsel|attorney)\w*"),
        r"\b(?:inspect\w*|examin\w*|review|copy|copies|verify|verification)\b.{0,200}\b(?:books|records|ledgers|documents|facilit\w*|premises|locations?|plants?|sites?|operations|warehouses?)\b",
        r"\b(?:books|records)\b.{0,200}\b(?:inspect\w*|examin\w*|available|access|review|audit\w*|cop(?:y|ies)|verif\w*)\b",
        r"\baccess\b.{0,150}\b(?:books|records|to verify)\b",
        r"\b(?:give|grant|provide|permit|allow|afford)\w*\b.{0,60}\baccess\b.{0,100}\b(?:premises|facilit\w*|sites?|plants?|offices?)\b",
        r"\b(?:to|and) verify\b.{0,150}\b(?:payments?|funds|amounts?|royalt\w*|fees|compliance|accuracy|reports?|statements?)",
        r"\bright to (?:enter|visit)\b",
        r"\binspection\b",
    ),
    "commitments": (
        (r"\bminimum\b", r"!\bat a minimum\b|\bminimum (?:extent|necessary|standards?)\b|\bto the minimum\b"
                           r"|\bthe minimum (?:required|necessary|needed|share|amount necessary)\b"),
        rf"\b(?:purchase|spend|order|pay|buy|sell|provide|invest|commit|guarantee|tender|deliver|ship|broadcast|promote|achieve|generate)\w*\b.{{0,150}}\b(?:at least|not less than|no less than|a minimum of|not fewer than|no fewer than) (?:\(|\$|\d|\[|\*|{_NUM}\b)",
        rf"\b(?:at least|not less than|no less than|not fewer than|no fewer than)\b.{{0,100}}{_MONEYISH}.{{0,150}}\b(?:purchase|spend|order|pay|buy|sell|provide|invest|commit|guarantee|tender|deliver|ship|royalt\w*|revenues?|sales|budget|units|fees?)",
        r"\bguarantee\w*\b.{0,60}\b(?:to )?(?:purchase|order|buy|pay|spend|revenue|royalt)",
        r"\bshortfall\b",
        r"\btake[- ]or[- ]pay\b",
        r"\bcommit\w*\b.{0,60}\b(?:to )?(?:purchase|buy|spend|order|budget|volume)",
        r"\bbinding (?:forecast|order|commitment|purchase)s?\b",
        r"\bfirm (?:orders?|commitments?|purchase)",
        r"\bliquidated damages\b",
        r"\b(?:termination|cancellation|break-?up|early termination|exit) (?:fee|payment|charge|penalty)s?\b",
        r"\b(?:as|by way of|constitutes?|be deemed|not as|not a) (?:a )?penalty\b",
        r"\b(?:shall|will) pay\b.{0,200}\b(?:as liquidated|as a penalty|by way of penalty|not as a penalty)\b",
        r"\b(?:volume|quantity|revenue|sales) (?:target|requirement|commitment|guarantee|quota)s?\b",
        r"\bquota\b",
    ),
}

# One clause per category that its rules must find (tests/unit/review/test_analysts.py checks every category has
# rules and an example they find, and reads the examples as a contract with one clause per category). A
# category is added here, rules and example, together with its entry in review/analysts.py (docs/extending.md).
EXAMPLES: dict[str, str] = {
    "liability_cap": "Liability. In no event shall either party's aggregate liability under this Agreement exceed the "
                     "fees paid in the twelve months before the claim.",
    "uncapped_liability": "Exclusions. The limitations in Section 1 shall not apply to a party's indemnification "
                          "obligations or to its gross negligence or willful misconduct.",
    "indemnification": "Indemnity. The Supplier shall indemnify, defend and hold harmless the Customer against all "
                       "third-party claims arising from the Services.",
    "termination": "Convenience. Either party may terminate this Agreement for convenience upon ninety (90) days' "
                   "prior written notice to the other party.",
    "renewal": "Term. This Agreement shall automatically renew for successive one-year renewal terms unless either "
               "party gives notice of non-renewal.",
    "restrictive_covenants": "Non-competition. During the Term the Supplier shall not, directly or indirectly, "
                             "compete with the Customer in the Territory.",
    "assignment": "Assignment. Neither party may assign this Agreement without the prior written consent of the "
                  "other party, including on a change of control.",
    "ip_ownership": "Ownership. All Deliverables shall be the sole and exclusive property of the Customer, and the "
                    "Supplier hereby assigns to the Customer all right, title and interest in them.",
    "license_grant": "Licence. The Supplier grants the Customer a non-exclusive, non-transferable, worldwide license "
                     "to use the Software during the Term.",
    "governing_law": "Governing law. This Agreement shall be governed by the laws of the State of New York.",
    "audit_rights": "Audit. The Customer may audit the Supplier's books and records once a year on thirty days' "
                    "notice.",
    "commitments": "Commitment. The Customer shall purchase a minimum of 10,000 units in each contract year.",
}


def _flex_spaces(pattern: str) -> str:
    """A literal space in a rule matches any run of whitespace (contracts are full of wrapped,
    padded lines); spaces inside [...] character classes are left alone."""
    out, in_class, escaped = [], False, False
    for ch in pattern:
        if escaped:
            out.append(ch)
            escaped = False
        elif ch == "\\":
            out.append(ch)
            escaped = True
        elif ch == "[":
            in_class = True
            out.append(ch)
        elif ch == "]":
            in_class = False
            out.append(ch)
        elif ch == " " and not in_class:
            out.append(r"\s+")
        else:
            out.append(ch)
    return "".join(out)


_Compiled = tuple[tuple[re.Pattern[str], ...], tuple[re.Pattern[str], ...]]  # (must match, must not match)


def _compile(rule: Rule) -> _Compiled:
    parts = (rule,) if isinstance(rule, str) else rule
    flags = re.IGNORECASE | re.DOTALL
    pos = tuple(re.compile(_flex_spaces(p), flags) for p in parts if not p.startswith("!"))
    neg = tuple(re.compile(_flex_spaces(p[1:]), flags) for p in parts if p.startswith("!"))
    return pos, neg


@functools.cache
def _compiled(rules: tuple[Rule, ...]) -> tuple[_Compiled, ...]:
    return tuple(_compile(r) for r in rules)


def _rules(cat: str) -> tuple[_Compiled, ...]:
    """The category's rules, compiled once per rule set: read from `PATTERNS` at each use, so rules added to it
    at run time (a test's throwaway category) count."""
    return _compiled(PATTERNS.get(cat, ()))

# Sentence-end candidates: . ! ? (optionally followed by closing quotes/brackets), then whitespace,
# then something that can start a sentence. Blank lines always end a unit.
_SENT_END = re.compile(r"[.!?][\"'”’)\]]*(?=\s+(?:[\"'“‘(\[]?[A-Z0-9]|\((?:[a-z]{1,4}|\d{1,3})\)\s))")
_BLANK = re.compile(r"\n[ \t\r\f\v]*\n")
_ABBREV = frozenset("""inc ltd co corp no nos sec secs art arts e.g i.e etc vs v mr ms mrs dr st jr sr u.s u.k
    l.p l.l.c llc n.a s.a b.v n.v p.c p.a fig figs approx para paras cf viz ex exh sch id hon prof
    dept est jan feb mar apr jun jul aug sep sept oct nov dec pp p pty plc gmbh ag s.r.l cie bros""".split())
_WORD_BEFORE = re.compile(r"([A-Za-z][A-Za-z.]*)$")
_MIN_UNIT = 25
_MAX_HEADING = 100  # a verb-less unit up to this long is a heading (or a bare number like "4.")
_LONG_UNIT = 600  # units longer than this are quoted by their ";"-separated parts
_MAX_QUOTE = 1500  # a region longer than this is cut down to a window of _WINDOW chars around the hit
_WINDOW = 400
_PART_END = re.compile(r";\s+|:\s+(?=\(?[a-z0-9]{1,4}\)|[A-Z(])|,?\s+(?=\((?:[a-z]|[ivx]{1,4}|[A-Z])\)\s)")


def _is_boundary(text: str, pos: int) -> bool:
    """Is the '.'/'!'/'?' at `pos` a sentence end (not an abbreviation or a number)?"""
    if text[pos] != ".":
        return True
    before = text[max(0, pos - 12):pos]
    if before[-1:].isdigit():
        # "1." starting a numbered paragraph or "Section 14.1." -- both end a unit harmlessly,
        # but a decimal like "$1.5" never reaches here (no whitespace after the dot).
        return True
    m = _WORD_BEFORE.search(before)
    if not m:
        return True
    # "Exhibit A. The ..." ends a sentence; a one-letter word is not treated as an initial.
    return m.group(1).lower().strip(".") not in _ABBREV


# A unit without any of these words is a heading, a number, or a table-of-contents line: it
# states no obligation, so it is never quoted on its own (see `_unit_spans`).
_VERBS = ("shall will may must is are be been being was were agree agrees has have had means grants grant does do "
          "not cannot hereby can might would should remain remains constitute constitutes unless if upon").split()
# Lower-case or upper-case forms only: a Title-Case "Grant of License" or "May 1" is not a verb.
_CLAUSE_VERB = re.compile(r"\b(?:" + "|".join(_VERBS + [v.upper() for v in _VERBS]) + r")\b")


# A definition that only points elsewhere ('"Initial Term" has the meaning set forth in Section 15.1.').
_XREF_DEFINITION = re.compile(r"^\W*[“\"'][^\"”]{1,80}[”\"']\s+(?:means|is defined|has the meaning|shall have the meaning)\b"
                              r"[^.;]{0,80}\b(?:Section|Article|Clause|Schedule|Exhibit|Appendix)\s+[\w.()]+\.?$",
                              re.IGNORECASE)


def _is_clause(unit: str) -> bool:
    return _CLAUSE_VERB.search(unit) is not None


# A table of contents: no verb, and a run of "Article 7 ...", "Schedule 2 ..." entries or of
# "... 48 8.2 Renewal 48 8.3 ..." page-number/section-number pairs.
_TOC_ENTRY = re.compile(r"(?:^|\s)(?:Article|ARTICLE|Section|SECTION|Schedule|SCHEDULE|Exhibit|EXHIBIT|Appendix|APPENDIX|Annex|ANNEX)"
                        r"\s+[0-9IVXLA-Z]+\b|\s\d{1,3}\s+\d{1,2}\.\d{1,2}\s")


def _is_contents(unit: str) -> bool:
    return not _is_clause(unit) and len(_TOC_ENTRY.findall(unit)) >= 3


def _unit_spans(text: str) -> list[tuple[int, int]]:
    """Sentence-ish units as (start, end) offsets, whitespace-trimmed.

    A heading ("4. Limitation of Liability.", "ARTICLE 9 ASSIGNMENT") is not a unit of its own:
    it is prefixed to the clause that follows it, so the heading's words count for that clause
    and the quote carries its heading. Units shorter than _MIN_UNIT are dropped.
    """
    cuts = {m.end() for m in _BLANK.finditer(text)}
    cuts.update(m.end() for m in _SENT_END.finditer(text) if _is_boundary(text, m.start()))
    spans: list[tuple[int, int]] = []
    heading: int | None = None  # start of pending heading text, if any
    prev = 0
    for cut in sorted(cuts) + [len(text)]:
        s, e = prev, cut
        prev = cut
        while s < e and text[s].isspace():
            s += 1
        while e > s and text[e - 1].isspace():
            e -= 1
        if s == e:
            continue
        unit = text[s:e]
        if len(unit) <= _MAX_HEADING and not _is_clause(unit):
            if heading is None or s - heading > 2 * _MAX_HEADING:
                heading = s
            continue
        start = heading if heading is not None else s
        heading = None
        if e - start >= _MIN_UNIT and not _is_contents(unit) and not _XREF_DEFINITION.match(text[start:e]):
            spans.append((start, e))
    return spans


def _part_bounds(unit: str) -> list[int]:
    return [0] + [m.end() for m in _PART_END.finditer(unit)] + [len(unit)]


def _region(unit: str, bounds: list[int], hs: int, he: int) -> tuple[int, int]:
    """The quote region for a hit at [hs, he): the whole unit if short, else the ";"-parts it spans."""
    if len(unit) <= _LONG_UNIT:
        return 0, len(unit)
    first = max(i for i in range(len(bounds) - 1) if bounds[i] <= hs)
    last = max(i for i in range(len(bounds) - 1) if bounds[i] < he)
    s, e = bounds[first], bounds[max(first, last) + 1]
    if e - s > _MAX_QUOTE:  # no usable ";" parts (a table, a run-on clause): a window around the hit
        s = max(s, hs - _WINDOW)
        e = min(e, he + _WINDOW)
        while s > 0 and not unit[s - 1].isspace() and hs - s < _WINDOW + 40:
            s -= 1  # do not start mid-word
        while e < len(unit) and not unit[e].isspace() and e - he < _WINDOW + 40:
            e += 1
    while s < e and unit[s].isspace():
        s += 1
    while e > s and unit[e - 1].isspace():
        e -= 1
    return s, e


def _match(unit: str, cat: str) -> list[tuple[int, int]]:
    """Quote regions (within `unit`) for the rules of `cat` that fire on it.

    A rule's positive patterns are searched in the whole unit and, for a long unit, in each of
    its parts too; its negative patterns veto it only inside the region that would be quoted, so
    one "breach" elsewhere in a long sentence does not hide a termination-for-convenience clause.
    A region that strictly contains another region of the same category is dropped.
    """
    regions: list[tuple[int, int]] = []
    long = len(unit) > _LONG_UNIT
    bounds = _part_bounds(unit) if long else [0, len(unit)]
    segments = [(0, len(unit))]
    if long:
        segments += [(bounds[i], bounds[i + 1]) for i in range(len(bounds) - 1)]
    for pos, neg in _rules(cat):
        if long and not all(p.search(unit) for p in pos):
            continue  # what the whole unit lacks, none of its parts has
        for ss, se in segments:
            ms = []
            for p in pos:  # cheapest-first order in the rule; stop at the first miss
                m = p.search(unit, ss, se)
                if m is None:
                    break
                ms.append(m)
            if len(ms) < len(pos):
                continue
            hs = min(m.start() for m in ms)
            he = max(m.end() for m in ms)
            rs, re_ = _region(unit, bounds, hs, he)
            if re_ - rs < _MIN_UNIT or (re_ - rs <= _MAX_HEADING and not _is_clause(unit[rs:re_])):
                continue  # a heading or list fragment alone is not a clause
            if any(n.search(unit, rs, re_) for n in neg):
                continue
            if (rs, re_) not in regions:
                regions.append((rs, re_))
    return [r for r in regions
            if not any(o != r and r[0] <= o[0] and o[1] <= r[1] for o in regions)]


def locate(chunk_text: str, categories: list[str]) -> list[dict[str, str]]:
    clauses = []
    for us, ue in _unit_spans(chunk_text):
        unit = chunk_text[us:ue]
        for cat in categories:
            for qs, qe in _match(unit, cat):
                clauses.append({"category": cat, "quote": unit[qs:qe]})
    return clauses


# Words that raise the risk of a located clause for the reviewing party.
_RISK = (
    (re.compile(r"\b(unlimited|uncapped|without limit)", re.I), 0.35),
    (re.compile(r"\b(sole (and absolute )?discretion|at any time|for any reason|without cause|for convenience)\b", re.I), 0.25),
    (re.compile(r"\b(perpetual|irrevocable|exclusive|worldwide)\b", re.I), 0.2),
    (re.compile(r"\b(indemnify|hold harmless|liquidated damages|penalt)", re.I), 0.2),
    (re.compile(r"\b(automatically renew|shall not assign|change of control|change in control|non-?compet|minimum)", re.I), 0.15),
    (re.compile(r"\b(gross negligence|wil(l)?ful misconduct|consequential damages|lost profits)\b", re.I), 0.1),
)


def score(quote: str) -> tuple[float, str]:
    s = 0.2
    reasons = []
    for pattern, weight in _RISK:
        m = pattern.search(quote)
        if m:
            s += weight
            reasons.append(m.group(0).lower())
    s = min(1.0, s)
    why = ("raises risk: " + ", ".join(reasons)) if reasons else "standard wording, no aggravating terms"
    return round(s, 2), why


class OfflineRuleModel:
    """Deterministic rule-based stand-in for a Bedrock model (offline default). Its usage is what the simulated
    Bedrock would report (doubles/bedrock_sim.py): four characters a token, Bedrock's tool-use system prompt
    counted, and the prompt cache as strict as Bedrock's (nothing under the model's minimum prefix)."""

    model_id = OFFLINE_MODEL_ID

    def __init__(self, prompt_cache: SimulatedPromptCache | None = None):
        self.prompt_cache = prompt_cache if prompt_cache is not None else SimulatedPromptCache()

    def invoke(self, request: ModelRequest) -> ModelResponse:
        payload = request.payload
        cats = [c["key"] for c in payload["categories"]]
        if request.step == "locate":
            body = {"clauses": locate(payload["chunk_text"], cats)}
        else:
            findings = []
            for c in payload.get("clauses", []):
                s, why = score(c["quote"])
                findings.append({"category": c["category"], "quote": c["quote"], "score": s, "rationale": why})
            body = {"findings": findings}
        text = json.dumps(body)
        cache = self.prompt_cache.use(self.model_id, request)
        return ModelResponse(text=text, stop_reason="end_turn", input_tokens=cache.uncached,
                             output_tokens=text_tokens(text), cache_read_tokens=cache.read,
                             cache_write_tokens=cache.written)
